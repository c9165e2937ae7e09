/**
 * What the actor host of a service is asked (DESIGN.md, "Actors" and "Failure model"): an edge
 * asks its queue group to host a connection's actor (`Open`); a stopping replica asks the others
 * to adopt one of its connections (`Adopt`), then passes on what reached it meanwhile
 * (`Forward`); a replica whose heartbeat lapsed is asked whether it still runs (`Ping`).
 */
import * as Schema from "effect/Schema"
import { isRecord } from "./browser/JsonRpc.ts"
import { decodeOpenEventFast, OpenEvent, openEventJson } from "./Edge.ts"

/** The service will not take the connection; the edge closes the socket with `code` and `reason`. */
export class OpenRefused extends Schema.TaggedError<OpenRefused>()("OpenRefused", { code: Schema.Int, reason: Schema.String }) {}

/**
 * An edge → the service's `open` queue group: host `conn`'s actor. Answered once the actor
 * listens on the connection's subject, so the edge never sends a frame before someone does.
 */
export class Open extends Schema.TaggedRequest<Open>()("Open", {
  failure: OpenRefused,
  success: Schema.Void,
  payload: { conn: Schema.String, edge: Schema.String, event: OpenEvent }
}) {}

/**
 * `new Open(fields, true)` without the Schema class's constructor, which copies the fields twice
 * (the first copy a dictionary, since it deletes `_tag` from it) and looks up defaults on every
 * call: 0.7 KB of each handshake, at the edge that sends an `Open` per socket and at the service
 * that reads it. The same instance, its fields in the same order (`Host.test.ts` holds it to the
 * constructor's).
 */
export const makeOpen = (conn: string, edge: string, event: OpenEvent): Open => {
  const open = Object.create(Open.prototype) as { -readonly [K in keyof Open]: Open[K] }
  open.conn = conn
  open.edge = edge
  open.event = event
  open._tag = "Open"
  return open
}

/**
 * An `Open` as its Schema encodes it to JSON, written by hand: an edge sends one per socket (see
 * `Edge.openEventJson`). `Host.test.ts` holds it to the Schema.
 */
export const encodeOpen = (open: Open): string =>
  JSON.stringify({ _tag: "Open", conn: open.conn, edge: open.edge, event: openEventJson(open.event) })

/**
 * What `Open`'s Schema decodes from parsed JSON, written by hand for the service's side of every
 * open: `undefined` wherever it is not sure, for the Schema to decode and say why.
 */
export const decodeOpenFast = (u: unknown): Open | undefined => {
  if (!isRecord(u)) return undefined
  const { _tag, conn, edge, event } = u
  if (_tag !== "Open" || typeof conn !== "string" || typeof edge !== "string") return undefined
  const decoded = decodeOpenEventFast(event)
  return decoded === undefined ? undefined : makeOpen(conn, edge, decoded)
}

/** The replica asked to adopt did not take the connection. */
export class AdoptRefused extends Schema.TaggedError<AdoptRefused>()("AdoptRefused", { reason: Schema.String }) {}

/**
 * A stopping replica → the service's `handoff` queue group: adopt this connection, with the state
 * its actor had in memory. The adopter answers with its replica id once it listens on the
 * connection's subject (its mailbox held) and owns the connection's record.
 */
export class Adopt extends Schema.TaggedRequest<Adopt>()("Adopt", {
  failure: AdoptRefused,
  success: Schema.String,
  payload: {
    conn: Schema.String,
    edge: Schema.String,
    open: OpenEvent,
    /** The replica handing it over; the connection's record names it until the adopter takes it. */
    from: Schema.String,
    /** What the actor kept only in memory (requests in flight), as its `onHandoff` gave it. */
    state: Schema.optional(Schema.Unknown)
  }
}) {}

/** A message the old owner received after the hand-off began, for the adopter to handle first. */
export const ForwardedMessage = Schema.Struct({
  headers: Schema.Record({ key: Schema.String, value: Schema.String }),
  /** base64: a peer message's body may be any bytes. */
  data: Schema.String,
  reply: Schema.optional(Schema.String)
})
export type ForwardedMessage = typeof ForwardedMessage.Type

/** The old owner → the adopter's inbox: the rest of its mailbox; the adopter then starts its own. */
export class Forward extends Schema.TaggedRequest<Forward>()("Forward", {
  failure: Schema.Never,
  success: Schema.Void,
  payload: { conn: Schema.String, messages: Schema.Array(ForwardedMessage) }
}) {}

/** Does this replica still run? Its answer is its replica id. */
export class Ping extends Schema.TaggedRequest<Ping>()("Ping", {
  failure: Schema.Never,
  success: Schema.String,
  payload: {}
}) {}

/** What a service's `open` queue group is asked. */
export const Opens = Schema.Union(Open)
export type Opens = typeof Opens.Type
/** What a service's `handoff` queue group is asked. */
export const Adoptions = Schema.Union(Adopt)
export type Adoptions = typeof Adoptions.Type
/** What one replica's own inbox is asked. */
export const ReplicaInbox = Schema.Union(Forward, Ping)
export type ReplicaInbox = typeof ReplicaInbox.Type
