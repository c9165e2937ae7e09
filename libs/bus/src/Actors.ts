/**
 * The service side of the edge protocol: one actor per connection. A connection's `open` request
 * reaches one replica through the service's queue group; that replica subscribes to the
 * connection's subject, records ownership in KV, and only then answers, so the edge never sends a
 * frame before someone listens. Frames are handled in order, one at a time, per actor.
 */
import { Edge } from "@switchboard/protocol"
import * as Instruments from "@switchboard/telemetry/Instruments"
import { Metrics } from "@switchboard/telemetry/Metrics"
import * as Cause from "effect/Cause"
import * as Duration from "effect/Duration"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import type * as Fiber from "effect/Fiber"
import * as FiberSet from "effect/FiberSet"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import { Bus, type BusMessage, type BusShape, type Headers, text, toBytes } from "./Bus.ts"
import { Kv, typed, type TypedBucket } from "./Kv.ts"
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

export interface Connection {
  readonly id: Subjects.ConnId
  readonly edge: Subjects.EdgeId
  readonly open: Edge.OpenEvent
  /** The token's `sub` when the upgrade was authenticated. */
  readonly user: string | undefined
  /** Sends one text frame to this connection's socket; never blocks. */
  readonly send: (data: Uint8Array | string, traceparent?: string) => void
  /**
   * Asks the edge to close the socket. The actor then receives `onClosed`. A Streamable HTTP
   * session has no socket: the actor ends itself the same way.
   */
  readonly close: (code: number, reason: string) => void
  /**
   * Sends a message to the actor of another connection of the same service, wherever it lives:
   * straight into its mailbox when it is on this replica, over the bus otherwise. `value`, when
   * given, is what `data` decodes to; a local receiver gets it back from `localValue` instead of
   * decoding `data` again.
   */
  readonly peer: (target: Subjects.ConnId, kind: string, data: Uint8Array | string, traceparent?: string, value?: unknown) => void
}

/** The decoded value a local peer sent along with a message, if it did. */
export const localValue = (message: BusMessage): unknown => (message instanceof LocalMessage ? message.value : undefined)

/**
 * An actor's session record in KV, keyed by its connection id: what a replica that adopts the
 * connection reads back (`restored`) to carry on. Saving and forgetting never fail the actor: a
 * lost record costs only the adoption.
 */
export const sessionStore = <A>(bucket: TypedBucket<A>) => ({
  remember: (conn: Connection, record: A) =>
    bucket.put(Subjects.Key.session(conn.id), record).pipe(Effect.catchAll((e) => Effect.logWarning("could not save session", e))),
  recall: (conn: Connection) =>
    bucket.get(Subjects.Key.session(conn.id)).pipe(Effect.map(Option.map((s) => s.value)), Effect.orElseSucceed(() => Option.none<A>())),
  forget: (conn: Connection) =>
    bucket.delete(Subjects.Key.session(conn.id)).pipe(Effect.catchAll((e) => Effect.logWarning("could not forget a closed session", e)))
})

/** A handle that sends to one socket on any edge, with its headers built once. */
export interface Socket {
  readonly send: (data: Uint8Array | string, traceparent?: string) => void
}

/**
 * What an actor does with its mailbox, one message at a time. A handler that finishes its work
 * synchronously returns nothing, and the host runs no Effect for that message: most frames of a
 * busy connection are handled this way.
 */
export interface Actor<R = never> {
  readonly onFrame: (frame: Frame) => Effect.Effect<void, never, R> | void
  /** A message from another actor (see `Connection.peer`); it may carry a reply subject. */
  readonly onPeer?: (message: BusMessage) => Effect.Effect<void, never, R> | void
  readonly onClosed?: (code: number, reason: string) => Effect.Effect<void, never, R>
}

/** Refuse a connection at open time; the edge closes it with this code and reason. */
export class Refuse {
  readonly _tag = "Refuse"
  constructor(
    readonly code: number,
    readonly reason: string
  ) {}
}

export interface HostOptions<R> {
  readonly service: Subjects.ServiceName
  /**
   * Builds the actor of a connection. Its scope lives as long as the connection, so
   * subscriptions and timers it opens end with it. `restored` is true when this replica adopts a
   * connection from one that stopped or died: the actor rebuilds its state from KV and does not
   * greet the client again.
   */
  readonly make: (connection: Connection, restored: boolean) => Effect.Effect<Actor<R>, Refuse, R | Scope.Scope>
  /** How often to look for connections whose edge died without saying so. */
  readonly edgeCheckInterval?: Duration.DurationInput
  /** How often a replica renews its liveness key; survivors adopt its connections once it lapses (3 intervals). */
  readonly replicaHeartbeat?: Duration.DurationInput
  /** This replica's id, when the service needs it too (its liveness key is `Key.replica(service, id)`). */
  readonly replica?: string
}

/** An actor record in the `connections` bucket. */
export const ConnectionRecord = Schema.Struct({
  service: Schema.String,
  replica: Schema.String,
  edge: Schema.String,
  /** Everything needed to rebuild the connection on another replica. */
  open: Edge.OpenEvent
})
export type ConnectionRecord = typeof ConnectionRecord.Type

const decodeOpen = Schema.decodeUnknownEither(Schema.parseJson(Edge.OpenEvent))
const encodeOpenReply = Schema.encodeSync(Schema.parseJson(Edge.OpenReply))
const encodeOpen = Schema.encodeSync(Schema.parseJson(Edge.OpenEvent))
const decodeOpenReply = Schema.decodeUnknownEither(Schema.parseJson(Edge.OpenReply))

/**
 * The edge's side of `open`: asks `service`'s queue group to host `conn`'s actor, and returns its
 * answer once the actor listens (see `host`). A socket and a Streamable HTTP session open alike.
 */
export const requestOpen = (
  bus: BusShape,
  service: Subjects.ServiceName,
  conn: Subjects.ConnId,
  edge: Subjects.EdgeId,
  event: Edge.OpenEvent,
  timeout: Duration.DurationInput
) =>
  bus.request(Subjects.open(service), encodeOpen(event), {
    timeout,
    headers: {
      [Subjects.Header.op]: "open",
      [Subjects.Header.conn]: conn,
      [Subjects.Header.edge]: edge,
      ...(event.claims === undefined ? {} : { [Subjects.Header.user]: event.claims.sub })
    }
  }).pipe(Effect.flatMap((m) => decodeOpenReply(text(m))))

class IncomingFrame implements Frame {
  private decoded: string | undefined
  constructor(private readonly message: BusMessage) {}
  get data() {
    return this.message.data
  }
  get text() {
    return (this.decoded ??= text(this.message))
  }
  get traceparent() {
    return this.message.header(Subjects.Header.traceparent)
  }
  get limited() {
    return this.message.header(Subjects.Header.reason) === "rate-limited"
  }
  get edge() {
    const edge = this.message.header(Subjects.Header.edge)
    return edge === undefined ? undefined : Subjects.EdgeId(edge)
  }
  get user() {
    return this.message.header(Subjects.Header.user)
  }
  get http() {
    return this.message.header(Subjects.Header.http)
  }
  get httpOp() {
    return this.message.header(Subjects.Header.httpOp)
  }
  get lastEventId() {
    return this.message.header(Subjects.Header.lastEventId)
  }
}

/**
 * One exchange of a Streamable HTTP session on the edge that holds it: a pending POST, answered
 * by its final response (`end`), or an open GET stream, whose events carry ids.
 */
export interface HttpExchange {
  readonly send: (data: Uint8Array | string, options?: { readonly end?: boolean; readonly eventId?: string; readonly traceparent?: string }) => void
}

/** Sends to sockets on any edge by id: one, many on the same edge (one bus message), or close. */
export const edgeLink = Effect.map(Bus, (bus) => ({
  /** One socket, for repeated sends (its headers are built once). */
  to: (edge: Subjects.EdgeId, conn: Subjects.ConnId): Socket => socket(bus, edge, Subjects.Header.conn, conn),
  /** Fan-out: many sockets of one edge as one handle; each send is one publish, however many receive it. */
  toMany: (edge: Subjects.EdgeId, conns: ReadonlyArray<Subjects.ConnId>): Socket => socket(bus, edge, Subjects.Header.conns, conns.join(",")),
  close: (edge: Subjects.EdgeId, conn: Subjects.ConnId, code: number, reason: string) => closeSocket(bus, edge, conn, code, reason),
  /** An exchange of a Streamable HTTP session; one subject per edge keeps notifications before the response they precede. */
  exchange: (edge: Subjects.EdgeId, conn: Subjects.ConnId, exchange: string): HttpExchange => {
    const out = Subjects.edgeOut(edge)
    return {
      send: (data, options = {}) => {
        const headers: Record<string, string> = { [Subjects.Header.op]: "deliver", [Subjects.Header.conn]: conn, [Subjects.Header.http]: exchange }
        if (options.end === true) headers[Subjects.Header.httpEnd] = "1"
        if (options.eventId !== undefined) headers[Subjects.Header.eventId] = options.eventId
        if (options.traceparent !== undefined) headers[Subjects.Header.traceparent] = options.traceparent
        bus.unsafePublish(out, data, headers)
      }
    }
  }
}))

const closeSocket = (bus: BusShape, edge: Subjects.EdgeId, conn: Subjects.ConnId, code: number, reason: string) =>
  bus.unsafePublish(Subjects.edgeOut(edge), "", {
    [Subjects.Header.op]: "close",
    [Subjects.Header.conn]: conn,
    [Subjects.Header.code]: String(code),
    [Subjects.Header.reason]: reason
  })

/**
 * Actors address each other by their connection's subject, never by replica: a `peer` message goes
 * into the other actor's mailbox, in order with its frames.
 */
const untracedPeerHeaders = new Map<string, Headers>()
export const peerHeaders = (kind: string, traceparent?: string): Headers => {
  if (traceparent !== undefined) {
    return { [Subjects.Header.op]: "peer", [Subjects.Header.kind]: kind, [Subjects.Header.traceparent]: traceparent }
  }
  // The same record every time, so adapters can cache what they derive from it.
  let h = untracedPeerHeaders.get(kind)
  if (h === undefined) untracedPeerHeaders.set(kind, (h = { [Subjects.Header.op]: "peer", [Subjects.Header.kind]: kind }))
  return h
}

/** `name` is `sb-conn` for one socket, `sb-conns` for a comma-separated group on the same edge. */
const socket = (bus: BusShape, edge: Subjects.EdgeId, name: string, value: string): Socket => {
  const out = Subjects.edgeOut(edge)
  const untraced = deliverHeaders(name, value, undefined)
  return {
    send: (data, traceparent) =>
      bus.unsafePublish(out, data, traceparent === undefined ? untraced : deliverHeaders(name, value, traceparent))
  }
}

/** A peer message that never left the process; it reads like one that came over the bus. */
class LocalMessage implements BusMessage {
  readonly reply = undefined
  private bytes: Uint8Array | undefined
  constructor(
    readonly subject: string,
    private readonly raw: Uint8Array | string,
    private readonly headers: Headers,
    readonly value: unknown
  ) {}
  /** Encoded on first use: a receiver that takes `value` never needs the bytes. */
  get data() {
    return (this.bytes ??= toBytes(this.raw))
  }
  header(name: string) {
    return this.headers[name]
  }
}

const deliverHeaders = (name: string, value: string, traceparent: string | undefined): Headers =>
  traceparent === undefined
    ? { [Subjects.Header.op]: "deliver", [name]: value }
    : { [Subjects.Header.op]: "deliver", [name]: value, [Subjects.Header.traceparent]: traceparent }

type Envelope = BusMessage | "edge-lost"

/**
 * An actor's mailbox: messages are handled one at a time, in arrival order. A handler that
 * finishes synchronously runs right where the message arrives, with no fiber to wake; one that
 * returns an Effect is forked, and the mailbox waits for it before the next message. Messages that
 * arrive while a message is being handled (a local peer's answer, say) are queued, never handled
 * inside it.
 */
class Mailbox<R> {
  private readonly queue: Array<Envelope> = []
  private head = 0
  private handler: ((m: Envelope) => Effect.Effect<void, never, R> | void) | undefined
  private busy = true
  constructor(private readonly fork: (work: Effect.Effect<void, never, R>) => Fiber.RuntimeFiber<void, never>) {}

  offer(m: Envelope) {
    this.queue.push(m)
    if (!this.busy) this.drain()
  }
  /** Begins handling, including what arrived before the actor was ready. */
  start(handler: (m: Envelope) => Effect.Effect<void, never, R> | void) {
    this.handler = handler
    this.busy = false
    this.drain()
  }
  /** Ignores everything from now on. */
  stop() {
    this.busy = true
    this.queue.length = 0
    this.head = 0
  }
  private drain() {
    const handler = this.handler
    if (handler === undefined) return
    this.busy = true
    while (this.head < this.queue.length) {
      const m = this.queue[this.head]!
      this.head++
      let work: Effect.Effect<void, never, R> | void
      try {
        work = handler(m)
      } catch (cause) {
        // As a defect, so the logger prints the error's message and stack, not `{}`.
        work = Effect.logError("actor handler threw", Cause.die(cause))
      }
      if (work !== undefined) {
        this.fork(work).addObserver(() => {
          this.busy = false
          this.drain()
        })
        return
      }
    }
    this.queue.length = 0
    this.head = 0
    this.busy = false
  }
}

/** Hosts the actors of one service until the scope closes. */
export const host = <R>(options: HostOptions<R>) =>
  Effect.gen(function*() {
    const bus = yield* Bus
    const kv = yield* Kv
    const heartbeat = Duration.decode(options.replicaHeartbeat ?? "2 seconds")
    const connections = typed(yield* kv.bucket(Subjects.Bucket.connections), ConnectionRecord)
    const edges = yield* kv.bucket(Subjects.Bucket.edges)
    const replicas = yield* kv.bucket(Subjects.Bucket.replicas)
    if (Duration.greaterThan(Duration.times(heartbeat, 2), Subjects.Bucket.replicas.ttl)) {
      return yield* Effect.dieMessage(`a replica heartbeat of ${Duration.format(heartbeat)} is too slow for its ${Subjects.Bucket.replicas.ttl} key lifetime`)
    }
    const replica = options.replica ?? randomUUID()
    const meter = Instruments.actorHost(yield* Metrics, options.service)
    const fibers = yield* FiberSet.make()
    const runFork = yield* FiberSet.runtime(fibers)<R>()
    /** Mailboxes by edge, so a dead edge's connections can be closed together. */
    const byEdge = new Map<Subjects.EdgeId, Map<Subjects.ConnId, Mailbox<R>>>()
    /** The mailboxes of this replica's actors, for peer messages that need not leave the process. */
    const owned = new Map<Subjects.ConnId, Mailbox<R>>()
    const peer: Connection["peer"] = (target, kind, data, traceparent, value) => {
      const mailbox = owned.get(target)
      const headers = peerHeaders(kind, traceparent)
      if (mailbox !== undefined) {
        const subject = Subjects.conn(options.service, target)
        mailbox.offer(new LocalMessage(subject, data, headers, value))
      } else {
        bus.unsafePublish(Subjects.conn(options.service, target), data, headers)
      }
    }

    /**
     * Runs one connection's actor: subscribe, build, then handle its mailbox in order until the
     * socket closes. `answer` tells the edge (on open) whether the actor took the connection.
     */
    const run = (
      connId: Subjects.ConnId,
      edgeId: Subjects.EdgeId,
      event: Edge.OpenEvent,
      restored: boolean,
      answer: (reply: Edge.OpenReply) => Effect.Effect<void>
    ) => {
      const mailbox = new Mailbox<R>(runFork)
      // A Streamable HTTP session outlives any edge: a dead edge's sweep must not end it.
      const http = event.transport === "http"
      const subject = Subjects.conn(options.service, connId)
      // The actor's scope: what it opens (subscriptions, timers, views) ends with the connection.
      return Effect.flatMap(Scope.make(), (scope) => Effect.gen(function*() {
        yield* Scope.extend(bus.subscribe(subject, (m) => mailbox.offer(m)), scope)
        const connection: Connection = {
          id: connId,
          edge: edgeId,
          open: event,
          user: event.claims?.sub,
          send: socket(bus, edgeId, Subjects.Header.conn, connId).send,
          peer,
          close: http
            ? (code, reason) =>
              bus.unsafePublish(subject, "", { [Subjects.Header.op]: "closed", [Subjects.Header.code]: String(code), [Subjects.Header.reason]: reason })
            : (code, reason) => closeSocket(bus, edgeId, connId, code, reason)
        }
        const made = yield* Effect.exit(Scope.extend(options.make(connection, restored), scope))
        if (Exit.isFailure(made)) {
          const refusal = Exit.causeOption(made).pipe(
            Option.flatMap((cause) => (cause._tag === "Fail" ? Option.some(cause.error) : Option.none()))
          )
          yield* answer(
            Option.match(refusal, {
              onNone: () => ({ ok: false, code: Edge.CloseCode.InternalError, reason: "could not start the session" }),
              onSome: (r) => ({ ok: false, code: r.code, reason: r.reason })
            })
          )
          yield* Scope.close(scope, made)
          return
        }
        const actor = made.value
        if (!http) {
          let local = byEdge.get(edgeId)
          if (!local) byEdge.set(edgeId, (local = new Map()))
          local.set(connId, mailbox)
        }
        owned.set(connId, mailbox)
        yield* meter.hosting(event, scope)
        yield* answer({ ok: true })

        const closed = yield* Deferred.make<readonly [number, string]>()
        mailbox.start((m) => {
          if (m === "edge-lost") return void Deferred.unsafeDone(closed, Exit.succeed([1006, "edge lost"] as const))
          const op = m.header(Subjects.Header.op)
          if (op === "frame") return actor.onFrame(new IncomingFrame(m))
          if (op === "peer") return actor.onPeer?.(m)
          if (op === "closed") {
            const code = Number(m.header(Subjects.Header.code) ?? 1005)
            Deferred.unsafeDone(closed, Exit.succeed([code, m.header(Subjects.Header.reason) ?? ""] as const))
          }
        })
        const [code, reason] = yield* Deferred.await(closed)
        mailbox.stop()
        if (actor.onClosed) yield* actor.onClosed(code, reason)
        yield* connections.delete(connId).pipe(Effect.catchAll((e) => Effect.logWarning("could not remove a closed connection's record", e)))
      }).pipe(Effect.onExit((exit) => Scope.close(scope, exit)))).pipe(
        // When this replica stops, its actors end without `onClosed`: their state stays in KV for
        // the replica that adopts them.
        Effect.ensuring(
          Effect.sync(() => {
            mailbox.stop()
            owned.delete(connId)
            const local = byEdge.get(edgeId)
            local?.delete(connId)
            if (local?.size === 0) byEdge.delete(edgeId)
          })
        ),
        Effect.annotateLogs({ service: options.service, conn: connId }),
        Effect.catchAllCause((cause) => Effect.logError("actor failed", cause))
      )
    }

    const record = (connId: Subjects.ConnId, edgeId: Subjects.EdgeId, event: Edge.OpenEvent) =>
      connections
        .put(connId, { service: options.service, replica, edge: edgeId, open: event })
        .pipe(Effect.catchAll((e) => Effect.logWarning("could not record connection ownership", e)))

    yield* bus.subscribe(
      Subjects.open(options.service),
      (m) => {
        const connId = m.header(Subjects.Header.conn)
        const edgeId = m.header(Subjects.Header.edge)
        const event = decodeOpen(text(m))
        if (connId === undefined || edgeId === undefined || event._tag === "Left") {
          runFork(Effect.logWarning(`ignoring a malformed open event on ${m.subject}`))
          return
        }
        const id = Subjects.ConnId(connId)
        const edge = Subjects.EdgeId(edgeId)
        // Ownership is recorded before the edge hears "ok", so a replica that dies right after
        // still leaves a record to adopt.
        runFork(
          run(id, edge, event.right, false, (reply) =>
            Effect.zipRight(
              reply.ok ? record(id, edge, event.right) : Effect.void,
              bus.respond(m, encodeOpenReply(reply)).pipe(Effect.catchAll((e) => Effect.logWarning("could not answer an open request", e)))
            ))
        )
      },
      { queue: Subjects.Queue.service(options.service) }
    )

    // --- liveness: this replica's heartbeat, and adoption of connections whose replica lapsed ---

    const replicaKey = Subjects.Key.replica(options.service, replica)
    yield* replicas.put(replicaKey, String(Date.now()))
    yield* replicas.put(replicaKey, String(Date.now())).pipe(
      Effect.catchAll((e) => Effect.logWarning("replica heartbeat failed", e)),
      Effect.repeat(Schedule.spaced(heartbeat)),
      Effect.forkScoped
    )
    yield* Effect.addFinalizer(() => replicas.delete(replicaKey).pipe(Effect.ignore))

    const adopt = (connId: Subjects.ConnId, found: { readonly value: ConnectionRecord; readonly revision: number }) =>
      connections.update(connId, { ...found.value, replica }, found.revision).pipe(
        // Another survivor claimed it first; it is theirs.
        Effect.flatMap(() =>
          Effect.sync(() => {
            meter.adopted()
            runFork(run(connId, Subjects.EdgeId(found.value.edge), found.value.open, true, () => Effect.void))
          })
        ),
        Effect.catchTag("KvConflict", () => Effect.void)
      )

    /** Replicas alive at the last sweep; a full scan happens at start and when one of them lapses. */
    let lastAlive: ReadonlySet<string> | undefined
    const sweep = Effect.gen(function*() {
      const alive = new Set(yield* replicas.keys(Subjects.Key.replicas(options.service)))
      const lapsed = lastAlive === undefined || [...lastAlive].some((r) => !alive.has(r))
      lastAlive = alive
      if (!lapsed) return
      const orphans: Array<Subjects.ConnId> = []
      for (const key of yield* connections.keys()) {
        const connId = Subjects.ConnId(key)
        if (owned.has(connId)) continue
        const found = yield* connections.get(key)
        if (Option.isNone(found) || found.value.value.service !== options.service) continue
        if (alive.has(Subjects.Key.replica(options.service, found.value.value.replica))) continue
        orphans.push(connId)
        yield* adopt(connId, found.value)
      }
      if (orphans.length > 0) yield* Effect.logInfo(`adopted ${orphans.length} connections from replicas that are gone`)
    })
    yield* sweep.pipe(
      Effect.catchAll((e) => Effect.logWarning("adoption sweep failed", e)),
      Effect.repeat(Schedule.spaced(heartbeat)),
      Effect.forkScoped
    )

    // An edge that dies cannot say its sockets closed; its heartbeat key expiring says it instead.
    yield* Effect.gen(function*() {
      for (const [edgeId, mailboxes] of byEdge) {
        // When KV cannot be read, assume the edge is alive rather than close healthy sockets.
        const alive = yield* edges.get(Subjects.Key.edge(edgeId)).pipe(Effect.map(Option.isSome), Effect.orElseSucceed(() => true))
        if (!alive) {
          yield* Effect.logWarning(`edge ${edgeId} is gone; closing its ${mailboxes.size} connections`)
          for (const mailbox of mailboxes.values()) mailbox.offer("edge-lost")
        }
      }
    }).pipe(Effect.repeat(Schedule.spaced(options.edgeCheckInterval ?? "5 seconds")), Effect.forkScoped)

    yield* Effect.logInfo(`${options.service}: hosting connection actors (replica ${replica})`)
  })
