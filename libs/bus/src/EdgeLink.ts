/**
 * The link between a service's actors and the edges that hold their sockets: the `open` request
 * (the edge asks, the service's host answers once the actor listens), the frames that come in, and
 * what goes back out on an edge's subject (deliveries, closes, Streamable HTTP exchanges). The
 * actor host (`Actors.host`) builds each connection's `send` and `close` from here.
 */
import { type Edge, Envelope, Host } from "@switchboard/protocol"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import type * as Exit from "effect/Exit"
import { Bus, type BusMessage, type BusShape, text } from "./Bus.ts"
import * as Peer from "./Peer.ts"
import * as Subjects from "./Subjects.ts"

export interface Frame {
  readonly data: Uint8Array
  /** The frame as text (decoded on first use). */
  readonly text: string
  readonly traceparent: string | undefined
  /** The edge's rate limit for this connection was exceeded: answer with the protocol's error. */
  readonly limited: boolean
  /** The edge the frame came from: where a Streamable HTTP session's answer goes. */
  readonly edge: Subjects.EdgeId | undefined
  /** The token subject the edge verified for this frame (a Streamable HTTP request carries its own token). */
  readonly user: string | undefined
  /** Streamable HTTP: the sending edge's exchange the frame came on (see `HttpExchange`). */
  readonly http: string | undefined
  /** Streamable HTTP control (`stream`, `stream-closed`) instead of a client message. */
  readonly httpOp: string | undefined
  /** On a `stream` control: the `Last-Event-ID` the client resumes from. */
  readonly lastEventId: string | undefined
}

/** A handle that sends to one socket on any edge, with its headers built once. */
export interface Socket {
  readonly send: (data: Uint8Array | string, traceparent?: string) => void
}

/**
 * One exchange of a Streamable HTTP session on the edge that holds it: a pending POST, answered
 * by its final response (`end`), or an open GET stream, whose events carry ids.
 */
export interface HttpExchange {
  readonly send: (
    data: Uint8Array | string,
    options?: { readonly end?: boolean; readonly eventId?: string; readonly traceparent?: string; readonly status?: number }
  ) => void
}

/** What a service's `open` queue group is asked: `requestOpen` asks, the actor host serves. */
export const opens = Peer.protocol(Host.Opens, { encode: { Open: Host.encodeOpen }, decode: { Open: Host.decodeOpenFast } })

/**
 * The edge's side of `open`: asks `service`'s queue group to host `conn`'s actor, and succeeds
 * once the actor listens (see `host`); `OpenRefused` carries the close the service wants. A socket
 * and a Streamable HTTP session open alike.
 */
export const requestOpen = (
  bus: BusShape,
  service: Subjects.ServiceName,
  conn: Subjects.ConnId,
  edge: Subjects.EdgeId,
  event: Edge.OpenEvent,
  timeout: Duration.DurationInput
) =>
  // Built from what the edge checked itself: no validation on construction.
  opens.callOn(bus, Subjects.open(service), Host.makeOpen(conn, edge, event), { timeout })

/**
 * `requestOpen` with a callback, as the edge asks for every socket: no fiber waits the moments
 * until the actor listens (see the Bus port's `unsafeRequest`). `onExit` is called once, never
 * before this returns.
 */
export const unsafeRequestOpen = (
  bus: BusShape,
  service: Subjects.ServiceName,
  conn: Subjects.ConnId,
  edge: Subjects.EdgeId,
  event: Edge.OpenEvent,
  timeout: Duration.DurationInput,
  onExit: (exit: Exit.Exit<void, Host.OpenRefused | Peer.PeerTimeout | Peer.PeerUnavailable>) => void
): void => void opens.unsafeCallOn(bus, Subjects.open(service), Host.makeOpen(conn, edge, event), { timeout }, onExit)

/**
 * A frame as the actor reads it: its text is decoded, and its envelope read, only when asked. A
 * frame whose envelope the edge garbled reads as one with none of the optional headers.
 */
export class IncomingFrame implements Frame {
  private decoded: string | undefined
  private envelope: Envelope.Frame | null | undefined
  constructor(private readonly message: BusMessage) {}
  private get headers(): Envelope.Frame | null {
    if (this.envelope === undefined) {
      const read = Envelope.decodeEdgeIn(this.message)
      this.envelope = Either.isRight(read) && read.right._tag === "Frame" ? read.right : null
    }
    return this.envelope
  }
  get data() {
    return this.message.data
  }
  get text() {
    return (this.decoded ??= text(this.message))
  }
  get traceparent() {
    return this.headers?.traceparent
  }
  get limited() {
    return this.headers?.limited === true
  }
  get edge() {
    const edge = this.headers?.edge
    return edge === undefined ? undefined : Subjects.EdgeId(edge)
  }
  get user() {
    return this.headers?.user
  }
  get http() {
    return this.headers?.http
  }
  get httpOp() {
    return this.headers?.httpOp
  }
  get lastEventId() {
    return this.headers?.lastEventId
  }
}

/**
 * How a `closed` ends its actor: its code and reason; one whose code is missing or garbled still
 * ends it, as a close frame with no status does (1005).
 */
export const closedOf = (m: BusMessage): readonly [number, string] => {
  const closed = Envelope.decodeEdgeIn(m)
  return Either.isRight(closed) && closed.right._tag === "Closed" ? [closed.right.code, closed.right.reason] : [1005, ""]
}

/** Which hand-off a `marker` ends the old owner's share of; undefined for a garbled one. */
export const markerOf = (m: BusMessage): string | undefined => {
  const marker = Envelope.decodeEdgeIn(m)
  return Either.isRight(marker) && marker.right._tag === "Marker" ? marker.right.handoff : undefined
}

/** Sends to sockets on any edge by id: one, many on the same edge (one bus message), or close. */
export const edgeLink = Effect.map(Bus, (bus) => ({
  /** One socket, for repeated sends (its headers are built once). */
  to: (edge: Subjects.EdgeId, conn: Subjects.ConnId): Socket => socket(bus, edge, { _tag: "Deliver", conn }),
  /** Fan-out: many sockets of one edge as one handle; each send is one publish, however many receive it. */
  toMany: (edge: Subjects.EdgeId, conns: ReadonlyArray<Subjects.ConnId>): Socket => socket(bus, edge, { _tag: "Fanout", conns }),
  close: (edge: Subjects.EdgeId, conn: Subjects.ConnId, code: number, reason: string) => closeSocket(bus, edge, conn, code, reason),
  /**
   * Closes a socket and ends `service`'s actor of it at once: when a client comes back through
   * another edge, the old socket's edge may be dead, and would never say that it closed.
   */
  closeAndEnd: (service: Subjects.ServiceName, edge: Subjects.EdgeId, conn: Subjects.ConnId, code: number, reason: string) => {
    closeSocket(bus, edge, conn, code, reason)
    endActor(bus, service, conn, code, reason)
  },
  /** An exchange of a Streamable HTTP session; one subject per edge keeps notifications before the response they precede. */
  exchange: (edge: Subjects.EdgeId, conn: Subjects.ConnId, exchange: string): HttpExchange => {
    const out = Subjects.edgeOut(edge)
    return {
      send: (data, options = {}) => {
        const { end = false, eventId, status, traceparent } = options
        bus.unsafePublish(out, data, Envelope.encodeEdgeOut({ _tag: "Exchange", conn, http: exchange, end, eventId, status, traceparent }))
      }
    }
  }
}))

/** Asks the edge to close a socket; the edge then tells the actor `closed`, as for any close. */
export const closeSocket = (bus: BusShape, edge: Subjects.EdgeId, conn: Subjects.ConnId, code: number, reason: string) =>
  bus.unsafePublish(Subjects.edgeOut(edge), "", Envelope.encodeEdgeOut({ _tag: "Close", conn, code, reason }))

/** Ends an actor as its socket's close would: what a session with no socket, or whose edge died, needs. */
export const endActor = (bus: BusShape, service: Subjects.ServiceName, conn: Subjects.ConnId, code: number, reason: string) =>
  bus.unsafePublish(Subjects.conn(service, conn), "", Envelope.encodeEdgeIn({ _tag: "Closed", code, reason }))

/**
 * One edge's id and outbound subject, as one pair of strings for all its connections: decoded
 * from each open, they were two copies per connection, about 84 bytes of every idle actor (issue
 * 29). Edges come and go over a replica's life, so the table starts again past `EDGES_KEPT`.
 */
const edges = new Map<string, readonly [Subjects.EdgeId, string]>()
const EDGES_KEPT = 1024
const edgeNames = (edge: string): readonly [Subjects.EdgeId, string] => {
  let names = edges.get(edge)
  if (names === undefined) {
    if (edges.size >= EDGES_KEPT) edges.clear()
    names = [Subjects.EdgeId(edge), Subjects.edgeOut(Subjects.EdgeId(edge))]
    edges.set(edge, names)
  }
  return names
}
/** An edge's id as the one string every connection of that edge shares. */
export const edgeIdOf = (edge: string): Subjects.EdgeId => edgeNames(edge)[0]

/** Deliveries to one socket, or to a group on the same edge; their untraced headers are built once. */
export const socket = (bus: BusShape, edge: Subjects.EdgeId, to: Envelope.Deliver | Envelope.Fanout): Socket => {
  const out = edgeNames(edge)[1]
  const untraced = Envelope.encodeEdgeOut(to)
  return {
    send: (data, traceparent) => bus.unsafePublish(out, data, traceparent === undefined ? untraced : Envelope.encodeEdgeOut({ ...to, traceparent }))
  }
}
