/**
 * The envelope between edges and services: what rides in the bus's headers around a client's
 * bytes. `EdgeIn` is what a connection's subject carries to its actor (frames, lifecycle, the
 * hand-off marker, peers' messages), `EdgeOut` what an edge's subject carries to it (deliveries,
 * closes, hand-off holds and releases). Each is a tagged union whose Schemas are the one header
 * codec; the hand-written twins below serve the hot path and are tested against them.
 */
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"

/** Header names of the envelope; `@switchboard/bus/Subjects` re-exports them for everything else on the bus. */
export const Header = {
  conn: "sb-conn",
  conns: "sb-conns",
  edge: "sb-edge",
  op: "sb-op",
  user: "sb-user",
  code: "sb-code",
  reason: "sb-reason",
  /** What a `peer` message between actors is: the tag of a typed one (`Attach`; see `Peer.ts`), or the registry's older kinds (`fromTab`). */
  kind: "sb-kind",
  /**
   * Streamable HTTP: the edge's exchange a message belongs to (a pending POST, or an open GET
   * stream), on a frame from the edge and on a delivery back to it.
   */
  http: "sb-http",
  /** Streamable HTTP control from the edge, on a frame without a body: `stream` (a GET stream opened), `stream-closed`. */
  httpOp: "sb-http-op",
  /** On a delivery to an exchange: `1` when the exchange ends after this message (a request's final response). */
  httpEnd: "sb-http-end",
  /** On a delivery to a GET stream: the SSE event id. */
  eventId: "sb-event-id",
  /** On a `stream` control: the `Last-Event-ID` the client resumes from. */
  lastEventId: "sb-last-event-id",
  /** On a hand-off's `hold` to the edge and the marker the edge puts on the connection's subject: which hand-off. */
  handoff: "sb-handoff",
  /**
   * On an answer to an exchange: its HTTP status when not 200. A modern request's refusal that only
   * a replica can find (a header mismatch against the tool's schema) is a 400 (MCP 2026-07-28).
   */
  httpStatus: "sb-http-status",
  /** On a modern `tools/call` from the edge: the request's `Mcp-Param-*` headers (`ParamHeaders.encodeReceived`). */
  mcpParams: "sb-mcp-params",
  /** On a `taskCancelled` broadcast: which task of the user. */
  task: "sb-task",
  traceparent: "traceparent",
  tracestate: "tracestate"
} as const

/**
 * `open` and `closed` are lifecycle events from the edge, `frame` is a client frame, `deliver`
 * and `close` are instructions to the edge, and `peer` is a message from one actor to another.
 * A hand-off (a replica stopping) adds `hold` and `release` to the edge, and `marker`, which the
 * held edge puts on the connection's subject after the last frame the old owner must handle.
 */
export type Op = "open" | "frame" | "closed" | "deliver" | "close" | "peer" | "hold" | "release" | "marker"

/** Headers as the bus carries them. A header written empty reads back as absent (NATS), so "" and none are one. */
export type Headers = Readonly<Record<string, string>>
/** How a received message's headers are read: one lookup per name (the bus adapters parse lazily). */
export interface HeaderSource {
  readonly header: (name: string) => string | undefined
}

// --- the Schemas: one header codec ------------------------------------------------------------

/** The variant's tag, read from and written to `sb-op`. */
const tagged = <const T extends string>(tag: T, op: Op) =>
  Schema.transform(Schema.Literal(op), Schema.Literal(tag), { strict: true, decode: () => tag, encode: () => op }).pipe(
    Schema.propertySignature,
    Schema.fromKey(Header.op)
  )
const required = <S extends Schema.Schema.AnyNoContext>(name: string, schema: S) => Schema.propertySignature(schema).pipe(Schema.fromKey(name))
const optional = <S extends Schema.Schema.AnyNoContext>(name: string, schema: S) => Schema.optional(schema).pipe(Schema.fromKey(name))
/** A header that must not be there: it would make the message another variant. */
const absent = (name: string) => Schema.optional(Schema.Never).pipe(Schema.fromKey(name))
/** A header that is a flag: present with `value`, or absent. */
const flag = (name: string, value: string) =>
  Schema.optionalToRequired(Schema.Literal(value), Schema.Boolean, {
    decode: Option.isSome,
    encode: (on) => (on ? Option.some(value) : Option.none())
  }).pipe(Schema.fromKey(name))

/** A close code as the header writes it: decimal digits, nothing else (`Number` would take "", " 7" and "0x10"). */
const DIGITS = /^\d{1,9}$/
const Code = Schema.transform(Schema.String.pipe(Schema.pattern(DIGITS)), Schema.Int, { strict: true, decode: Number, encode: String })
/** Names (connections, edges, exchanges, hand-off tokens) are never empty: an empty header reads as absent. */
const Name = Schema.NonEmptyString
const Reason = Schema.optionalWith(Schema.String, { default: () => "" }).pipe(Schema.fromKey(Header.reason))

/** What a close says (`close` to the edge, `closed` from it). */
const closeFields = { code: required(Header.code, Code), reason: Reason }
/** The hand-off's operations (`hold`, `release`, `marker`): each names the connection, and which hand-off. */
const handoffOp = <const T extends string>(tag: T, op: Op) =>
  Schema.Struct({ _tag: tagged(tag, op), conn: required(Header.conn, Name), handoff: required(Header.handoff, Name) })

/** A client's frame (its bytes are the body), or a Streamable HTTP control (`httpOp`) with none. */
export const Frame = Schema.Struct({
  _tag: tagged("Frame", "frame"),
  conn: required(Header.conn, Name),
  edge: required(Header.edge, Name),
  /** The token subject the edge verified for this frame. */
  user: optional(Header.user, Name),
  /** The edge's rate limit for this connection was exceeded: answer with the protocol's error. */
  limited: flag(Header.reason, "rate-limited"),
  http: optional(Header.http, Name),
  httpOp: optional(Header.httpOp, Schema.Literal("stream", "stream-closed")),
  lastEventId: optional(Header.lastEventId, Name),
  traceparent: optional(Header.traceparent, Name)
})
export type Frame = typeof Frame.Type

/** The connection closed (an edge's socket, a session deleted, or a service ending an actor with no socket). */
export const Closed = Schema.Struct({
  _tag: tagged("Closed", "closed"),
  conn: optional(Header.conn, Name),
  edge: optional(Header.edge, Name),
  ...closeFields
})
export type Closed = typeof Closed.Type

/** Put by a held edge after the last frame the old owner must handle (see `@switchboard/bus/Handoff`). */
export const Marker = handoffOp("Marker", "marker")
export type Marker = typeof Marker.Type

/** A message from another actor; its body is the peer protocol's (`@switchboard/bus/Peer`), named by `kind`. */
export const Peer = Schema.Struct({
  _tag: tagged("Peer", "peer"),
  kind: required(Header.kind, Name),
  traceparent: optional(Header.traceparent, Name)
})
export type Peer = typeof Peer.Type

export const EdgeIn = Schema.Union(Frame, Closed, Marker, Peer)
export type EdgeIn = typeof EdgeIn.Type

/** A Streamable HTTP exchange's delivery: `end` when the exchange ends after it (a request's final response). */
export const Exchange = Schema.Struct({
  _tag: tagged("Exchange", "deliver"),
  conn: required(Header.conn, Name),
  http: required(Header.http, Name),
  end: flag(Header.httpEnd, "1"),
  eventId: optional(Header.eventId, Name),
  /** The answer's HTTP status when not 200 (a refusal); the edge takes only a 4xx. */
  status: optional(Header.httpStatus, Code),
  traceparent: optional(Header.traceparent, Name)
})
export type Exchange = typeof Exchange.Type

/** To one socket. */
export const Deliver = Schema.Struct({
  _tag: tagged("Deliver", "deliver"),
  conn: required(Header.conn, Name),
  // Named so that a garbled exchange delivery is refused rather than read as a socket's.
  http: absent(Header.http),
  traceparent: optional(Header.traceparent, Name)
})
export type Deliver = typeof Deliver.Type

/** To many sockets of one edge, as one message (comma-separated ids; none is an empty group). */
export const Fanout = Schema.Struct({
  _tag: tagged("Fanout", "deliver"),
  conn: absent(Header.conn),
  http: absent(Header.http),
  conns: Schema.optionalWith(Schema.split(","), { default: () => [] }).pipe(Schema.fromKey(Header.conns)),
  traceparent: optional(Header.traceparent, Name)
})
export type Fanout = typeof Fanout.Type

export const Close = Schema.Struct({
  _tag: tagged("Close", "close"),
  conn: required(Header.conn, Name),
  ...closeFields
})
export type Close = typeof Close.Type

/** A hand-off begins: hold the connection's frames and put a marker on its subject. */
export const Hold = handoffOp("Hold", "hold")
export type Hold = typeof Hold.Type

/** The hand-off is over (its new owner listens, or it failed): send the held frames on. */
export const Release = handoffOp("Release", "release")
export type Release = typeof Release.Type

/** Deliveries are told apart by their headers: an exchange names `sb-http`, one socket `sb-conn`, a group `sb-conns`. */
export const EdgeOut = Schema.Union(Exchange, Deliver, Fanout, Close, Hold, Release)
export type EdgeOut = typeof EdgeOut.Type

/**
 * A request that needs no session (MCP 2026-07-28), to any replica of the service, or the client's
 * cancellation of one: who asks, and the edge's exchange that waits for the answer. It has no
 * `sb-op`: its subject (`Subjects.stateless`, `Subjects.statelessCancelled`) says what it is.
 */
export const Stateless = Schema.Struct({
  user: required(Header.user, Name),
  edge: required(Header.edge, Name),
  http: required(Header.http, Name),
  /** A `tools/call`'s `Mcp-Param-*` headers, for the replica to check against the tool's schema. */
  params: optional(Header.mcpParams, Name),
  traceparent: optional(Header.traceparent, Name)
})
export type Stateless = typeof Stateless.Type

/** Why a message is no envelope, in a few words for the log (`sb-code: ...`). */
export type Refusal = string

// --- the Schema path: the reference, and what words a refusal ----------------------------------

const envelopeNames = Object.values(Header)

/** The headers of a received message as a record, for the Schemas. */
export const headersOf = (source: HeaderSource): Headers => {
  const headers: Record<string, string> = {}
  for (const name of envelopeNames) {
    const value = source.header(name)
    if (value !== undefined && value !== "") headers[name] = value
  }
  return headers
}

const refusal = (error: ParseResult.ParseError): Refusal => {
  const issues = ParseResult.ArrayFormatter.formatErrorSync(error)
  // A union's members each say why they did not match; the one that got furthest is the useful one.
  const deepest = issues.reduce<(typeof issues)[number] | undefined>((best, i) => (best === undefined || i.path.length > best.path.length ? i : best), undefined)
  if (deepest === undefined) return "malformed envelope"
  return deepest.path.length === 0 ? deepest.message : `${deepest.path.map(String).join(".")}: ${deepest.message}`
}

const decodeInSchema = Schema.decodeUnknownEither(EdgeIn)
const decodeOutSchema = Schema.decodeUnknownEither(EdgeOut)
const hasOp = (headers: Headers): Refusal | undefined => (headers[Header.op] === undefined ? `${Header.op}: is missing` : undefined)

/** The Schema-only decode: the reference for `decodeEdgeIn`, and what words its refusals. Exported for tests. */
export const decodeEdgeInWithSchema = (headers: Headers): Either.Either<EdgeIn, Refusal> => {
  const missing = hasOp(headers)
  return missing !== undefined ? Either.left(missing) : Either.mapLeft(decodeInSchema(headers), refusal)
}
/** The Schema-only decode: the reference for `decodeEdgeOut`, and what words its refusals. Exported for tests. */
export const decodeEdgeOutWithSchema = (headers: Headers): Either.Either<EdgeOut, Refusal> => {
  const missing = hasOp(headers)
  return missing !== undefined ? Either.left(missing) : Either.mapLeft(decodeOutSchema(headers), refusal)
}
const decodeStatelessSchema = Schema.decodeUnknownEither(Stateless)
/** The Schema-only decode: the reference for `decodeStateless`. Exported for tests. */
export const decodeStatelessWithSchema = (headers: Headers): Either.Either<Stateless, Refusal> =>
  Either.mapLeft(decodeStatelessSchema(headers), refusal)

/** The Schema-only encode: the reference for `encodeEdgeIn`/`encodeEdgeOut`/`encodeStateless`. Exported for tests. */
export const encodeStatelessWithSchema = Schema.encodeSync(Stateless)
export const encodeEdgeInWithSchema = Schema.encodeSync(EdgeIn)
export const encodeEdgeOutWithSchema = Schema.encodeSync(EdgeOut)

// --- the fast path: hand-written twins of the Schemas ------------------------------------------
// Every frame and every delivery crosses here; the Schema decoders cost more than the relay
// itself. Each twin accepts exactly what its Schema accepts, returns the same value, and leaves
// the wording of a refusal to the Schema.

/** A header that is a name: absent, or not empty. */
const name = (source: HeaderSource, header: string): string | undefined => {
  const value = source.header(header)
  return value === "" ? undefined : value
}
const code = (source: HeaderSource): number | undefined => {
  const value = source.header(Header.code)
  return value !== undefined && DIGITS.test(value) ? Number(value) : undefined
}

const frameFast = (s: HeaderSource): Frame | undefined => {
  const conn = name(s, Header.conn)
  const edge = name(s, Header.edge)
  const reason = name(s, Header.reason)
  const httpOp = name(s, Header.httpOp)
  if (conn === undefined || edge === undefined || (reason !== undefined && reason !== "rate-limited")) return undefined
  if (httpOp !== undefined && httpOp !== "stream" && httpOp !== "stream-closed") return undefined
  const frame: { -readonly [K in keyof Frame]: Frame[K] } = { _tag: "Frame", conn, edge, limited: reason !== undefined }
  const user = name(s, Header.user)
  if (user !== undefined) frame.user = user
  const http = name(s, Header.http)
  if (http !== undefined) frame.http = http
  if (httpOp !== undefined) frame.httpOp = httpOp
  const lastEventId = name(s, Header.lastEventId)
  if (lastEventId !== undefined) frame.lastEventId = lastEventId
  const traceparent = name(s, Header.traceparent)
  if (traceparent !== undefined) frame.traceparent = traceparent
  return frame
}

const closedFast = (s: HeaderSource): Closed | undefined => {
  const c = code(s)
  if (c === undefined) return undefined
  const closed: { -readonly [K in keyof Closed]: Closed[K] } = { _tag: "Closed", code: c, reason: name(s, Header.reason) ?? "" }
  const conn = name(s, Header.conn)
  if (conn !== undefined) closed.conn = conn
  const edge = name(s, Header.edge)
  if (edge !== undefined) closed.edge = edge
  return closed
}

const handoffOf = <T extends "Marker" | "Hold" | "Release">(_tag: T, s: HeaderSource) => {
  const conn = name(s, Header.conn)
  const handoff = name(s, Header.handoff)
  return conn === undefined || handoff === undefined ? undefined : { _tag, conn, handoff }
}

const peerFast = (s: HeaderSource): Peer | undefined => {
  const kind = name(s, Header.kind)
  if (kind === undefined) return undefined
  const traceparent = name(s, Header.traceparent)
  return traceparent === undefined ? { _tag: "Peer", kind } : { _tag: "Peer", kind, traceparent }
}

const deliverFast = (s: HeaderSource): Exchange | Deliver | Fanout | undefined => {
  const traceparent = name(s, Header.traceparent)
  const conn = name(s, Header.conn)
  const http = name(s, Header.http)
  if (http !== undefined) {
    const end = name(s, Header.httpEnd)
    if (conn === undefined || (end !== undefined && end !== "1")) return undefined
    const ex: { -readonly [K in keyof Exchange]: Exchange[K] } = { _tag: "Exchange", conn, http, end: end !== undefined }
    const eventId = name(s, Header.eventId)
    if (eventId !== undefined) ex.eventId = eventId
    const status = name(s, Header.httpStatus)
    if (status !== undefined) {
      // Not digits: the Schema words the refusal.
      if (!DIGITS.test(status)) return undefined
      ex.status = Number(status)
    }
    if (traceparent !== undefined) ex.traceparent = traceparent
    return ex
  }
  if (conn !== undefined) return traceparent === undefined ? { _tag: "Deliver", conn } : { _tag: "Deliver", conn, traceparent }
  const conns = name(s, Header.conns)?.split(",") ?? []
  return traceparent === undefined ? { _tag: "Fanout", conns } : { _tag: "Fanout", conns, traceparent }
}

const closeFast = (s: HeaderSource): Close | undefined => {
  const conn = name(s, Header.conn)
  const c = code(s)
  return conn === undefined || c === undefined ? undefined : { _tag: "Close", conn, code: c, reason: name(s, Header.reason) ?? "" }
}

/** What a connection's subject carries, read from a message's headers; a refusal says which header is wrong. */
export const decodeEdgeIn = (source: HeaderSource): Either.Either<EdgeIn, Refusal> => {
  const op = source.header(Header.op)
  const fast = op === "frame"
    ? frameFast(source)
    : op === "peer"
    ? peerFast(source)
    : op === "closed"
    ? closedFast(source)
    : op === "marker"
    ? handoffOf("Marker", source)
    : undefined
  return fast === undefined ? decodeEdgeInWithSchema(headersOf(source)) : Either.right(fast)
}

/** What an edge's subject carries, read from a message's headers; a refusal says which header is wrong. */
export const decodeEdgeOut = (source: HeaderSource): Either.Either<EdgeOut, Refusal> => {
  const op = source.header(Header.op)
  const fast = op === "deliver"
    ? deliverFast(source)
    : op === "close"
    ? closeFast(source)
    : op === "hold"
    ? handoffOf("Hold", source)
    : op === "release"
    ? handoffOf("Release", source)
    : undefined
  return fast === undefined ? decodeEdgeOutWithSchema(headersOf(source)) : Either.right(fast)
}

/** A stateless request's headers (or its cancellation's); a refusal says which header is wrong. */
export const decodeStateless = (source: HeaderSource): Either.Either<Stateless, Refusal> => {
  const user = name(source, Header.user)
  const edge = name(source, Header.edge)
  const http = name(source, Header.http)
  if (user === undefined || edge === undefined || http === undefined) return decodeStatelessWithSchema(headersOf(source))
  const stateless: { -readonly [K in keyof Stateless]: Stateless[K] } = { user, edge, http }
  const params = name(source, Header.mcpParams)
  if (params !== undefined) stateless.params = params
  const traceparent = name(source, Header.traceparent)
  if (traceparent !== undefined) stateless.traceparent = traceparent
  return Either.right(stateless)
}

/** Adds the optional headers that are set; a header record is built once per message, or once per connection. */
const withOptional = (headers: Record<string, string>, pairs: ReadonlyArray<readonly [string, string | undefined]>): Headers => {
  for (const [header, value] of pairs) if (value !== undefined) headers[header] = value
  return headers
}

const handoffHeaders = (op: Op, m: Marker | Hold | Release): Headers => ({ [Header.op]: op, [Header.conn]: m.conn, [Header.handoff]: m.handoff })

/** The headers of a message to a connection's actor. */
export const encodeEdgeIn = (m: EdgeIn): Headers => {
  switch (m._tag) {
    case "Frame": {
      // Written out, not through `withOptional`: a Streamable HTTP request builds one per message.
      const headers: Record<string, string> = { [Header.op]: "frame", [Header.conn]: m.conn, [Header.edge]: m.edge }
      if (m.user !== undefined) headers[Header.user] = m.user
      if (m.limited) headers[Header.reason] = "rate-limited"
      if (m.traceparent !== undefined) headers[Header.traceparent] = m.traceparent
      if (m.http !== undefined) headers[Header.http] = m.http
      if (m.httpOp !== undefined) headers[Header.httpOp] = m.httpOp
      if (m.lastEventId !== undefined) headers[Header.lastEventId] = m.lastEventId
      return headers
    }
    case "Closed":
      return withOptional({ [Header.op]: "closed" }, [
        [Header.conn, m.conn],
        [Header.edge, m.edge],
        [Header.code, String(m.code)],
        [Header.reason, m.reason]
      ])
    case "Marker":
      return handoffHeaders("marker", m)
    case "Peer":
      return withOptional({ [Header.op]: "peer", [Header.kind]: m.kind }, [[Header.traceparent, m.traceparent]])
  }
}

/** The headers of a message to an edge. */
export const encodeEdgeOut = (m: EdgeOut): Headers => {
  switch (m._tag) {
    case "Exchange": {
      const headers: Record<string, string> = { [Header.op]: "deliver", [Header.conn]: m.conn, [Header.http]: m.http }
      if (m.end) headers[Header.httpEnd] = "1"
      return withOptional(headers, [[Header.eventId, m.eventId], [Header.httpStatus, m.status === undefined ? undefined : String(m.status)], [
        Header.traceparent,
        m.traceparent
      ]])
    }
    case "Deliver":
      return withOptional({ [Header.op]: "deliver", [Header.conn]: m.conn }, [[Header.traceparent, m.traceparent]])
    case "Fanout":
      return withOptional({ [Header.op]: "deliver", [Header.conns]: m.conns.join(",") }, [[Header.traceparent, m.traceparent]])
    case "Close":
      return { [Header.op]: "close", [Header.conn]: m.conn, [Header.code]: String(m.code), [Header.reason]: m.reason }
    case "Hold":
      return handoffHeaders("hold", m)
    case "Release":
      return handoffHeaders("release", m)
  }
}

/** The headers of a stateless request, or of its cancellation. */
export const encodeStateless = (m: Stateless): Headers =>
  withOptional({ [Header.user]: m.user, [Header.edge]: m.edge, [Header.http]: m.http }, [[Header.mcpParams, m.params], [Header.traceparent, m.traceparent]])
