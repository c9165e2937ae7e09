/**
 * The envelope bodies between edges and services that are not client frames. Client frames travel
 * as raw bytes with headers (see `@switchboard/bus/Subjects`), never wrapped in JSON.
 */
import { isString } from "effect/Predicate"
import * as Schema from "effect/Schema"
import { Claims, claimsJson, decodeClaimsFast } from "./Auth.ts"
import { isRecord } from "./browser/JsonRpc.ts"
import { optionalField } from "./Json.ts"

/** Body of a connection's `open` request to its service's queue group. */
export const OpenEvent = Schema.Struct({
  path: Schema.String,
  query: Schema.Record({ key: Schema.String, value: Schema.String }),
  origin: Schema.optional(Schema.String),
  /** The WebSocket subprotocol the edge accepted, if any. */
  protocol: Schema.optional(Schema.String),
  /** Present when the upgrade carried a valid token. */
  claims: Schema.optional(Claims),
  openedAt: Schema.Number,
  /**
   * `http`: a Streamable HTTP session, bound to no socket and no edge; any edge forwards its
   * requests. Absent for a WebSocket.
   */
  transport: Schema.optional(Schema.Literal("http"))
})
export type OpenEvent = typeof OpenEvent.Type

/**
 * An open event as its Schema encodes it to JSON: the declared fields only, in the Schema's order.
 * Every connection's open carries one twice (the edge's `Open`, the service's connection record),
 * and the Schema's encode of it and its claims allocated about 6 KB of each (issue 29). It checks
 * nothing: an event is built by an edge from what it checked itself, and read back with the Schema.
 */
export const openEventJson = (e: OpenEvent): OpenEvent => ({
  path: e.path,
  query: e.query,
  origin: e.origin,
  protocol: e.protocol,
  claims: e.claims === undefined ? undefined : claimsJson(e.claims),
  openedAt: e.openedAt,
  transport: e.transport
})

/** A query as its Schema decodes it: strings only, and no key that an object literal cannot hold as its own. */
const isQuery = (u: unknown): u is OpenEvent["query"] => {
  if (!isRecord(u) || Object.hasOwn(u, "__proto__")) return false
  for (const key in u) if (typeof u[key] !== "string") return false
  return true
}

/**
 * What `OpenEvent`'s Schema decodes from parsed JSON, written by hand for the services' side of
 * every open: `undefined` wherever it is not sure, for the Schema to decode and say why.
 * `Host.test.ts` holds it to the Schema.
 */
export const decodeOpenEventFast = (u: unknown): OpenEvent | undefined => {
  if (!isRecord(u)) return undefined
  const { claims, openedAt, origin, path, protocol, query, transport } = u
  if (typeof path !== "string" || !isQuery(query) || typeof openedAt !== "number") return undefined
  const event: { -readonly [K in keyof OpenEvent]: OpenEvent[K] } = { path, query, openedAt }
  if (!optionalField(event, "origin", origin, isString) || !optionalField(event, "protocol", protocol, isString)) return undefined
  if (!optionalField(event, "transport", transport, (t): t is "http" => t === "http")) return undefined
  if (claims === undefined) return event
  const decoded = decodeClaimsFast(claims)
  if (decoded === undefined) return undefined
  event.claims = decoded
  return event
}

/** An edge's heartbeat record in the `edges` bucket; the key expires when the edge dies. */
export const EdgeHeartbeat = Schema.Struct({
  startedAt: Schema.Number,
  connections: Schema.Number
})
export type EdgeHeartbeat = typeof EdgeHeartbeat.Type

/** Close codes the edge and services use (RFC 6455 §7.4.1 and the IANA registry). */
export const CloseCode = {
  Normal: 1000,
  GoingAway: 1001,
  ProtocolError: 1002,
  Unsupported: 1003,
  PolicyViolation: 1008,
  TooBig: 1009,
  InternalError: 1011,
  ServiceRestart: 1012,
  TryAgainLater: 1013
} as const

/** A plain HTTP request the edge hands to a service (on `http.<service>`), e.g. an admin API call. */
export const HttpRequest = Schema.Struct({
  method: Schema.String,
  path: Schema.String,
  query: Schema.Record({ key: Schema.String, value: Schema.String }),
  authorization: Schema.optional(Schema.String),
  body: Schema.String,
  /** The edge's public base URL as the client reached it (`PUBLIC_URL`, else the Host header): for URLs in answers. */
  base: Schema.optional(Schema.String)
})
export type HttpRequest = typeof HttpRequest.Type

export const HttpResponse = Schema.Struct({
  status: Schema.Int,
  body: Schema.Unknown,
  /** Seconds, sent as `Retry-After`: when a client turned away for load may ask again. */
  retryAfter: Schema.optional(Schema.Int)
})
export type HttpResponse = typeof HttpResponse.Type

/**
 * The edge asks the service that answers a path (`http.<service>`, its queue group) to handle one
 * plain HTTP request; every request gets a response, an error status included, so it cannot fail.
 */
export class HttpForward extends Schema.TaggedRequest<HttpForward>()("HttpForward", {
  failure: Schema.Never,
  success: HttpResponse,
  payload: HttpRequest.fields
}) {}

/** What the edge asks of a service besides its connections. */
export const ServiceHttp = Schema.Union(HttpForward)
export type ServiceHttp = typeof ServiceHttp.Type
