/**
 * Drives one connection actor of a service without sockets, the way `@effect/cluster`'s
 * `Entity.makeTestClient` drives one entity: the test stands where an edge stands on the bus. It
 * opens the connection with a real-shaped `open` request, sends frames with the edge's headers,
 * reads what the actor delivers to the socket from the edge's out subject, and closes it as a
 * socket closes. It runs on whatever bus the test provides (the embedded one for unit tests).
 *
 * Not exported from the package index: `@switchboard/bus` depends on this package for its tests,
 * so the index stays free of bus imports; import it as `@switchboard/testing/ActorClient`.
 */
import { Actors, Bus, Kv, Subjects } from "@switchboard/bus"
import { Edge, type Auth } from "@switchboard/protocol"
import * as Deferred from "effect/Deferred"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as FiberSet from "effect/FiberSet"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"

/** One message the actor sent towards the socket (`deliver`). */
export interface Delivery {
  readonly text: string
  readonly traceparent: string | undefined
  /** Streamable HTTP: the exchange it is for, whether it ends it, and its SSE event id. */
  readonly http: string | undefined
  readonly end: boolean
  readonly eventId: string | undefined
}

/** How the edge marks a frame it forwards. */
export interface FrameOptions {
  /** The edge's rate limit for the connection was exceeded. */
  readonly limited?: boolean
  readonly traceparent?: string
  /** Streamable HTTP: the exchange the request came on, and the user its own token verified as. */
  readonly http?: string
  readonly user?: string
  /** Streamable HTTP control instead of a client message (`stream`, `stream-closed`). */
  readonly httpOp?: string
  readonly lastEventId?: string
}

export interface OpenOptions {
  readonly path: string
  /** The verified token's subject; none for an unauthenticated upgrade. */
  readonly user?: string
  readonly claims?: Auth.Claims
  readonly origin?: string
  readonly query?: Readonly<Record<string, string>>
  readonly transport?: "http"
  /** Connection and edge ids; fresh ones when absent (a test may reuse an edge for two sockets). */
  readonly conn?: Subjects.ConnId
  readonly edge?: Subjects.EdgeId
  readonly timeout?: Duration.DurationInput
}

export interface ActorClient {
  readonly conn: Subjects.ConnId
  readonly edge: Subjects.EdgeId
  /** Sends one client frame (a value is JSON-encoded), as the edge forwards a socket's message. */
  readonly send: (frame: string | object, options?: FrameOptions) => Effect.Effect<void>
  /** The next message the actor delivered to the socket; waits for it. */
  readonly next: Effect.Effect<Delivery>
  /** The next delivery, parsed as JSON. */
  readonly nextJson: Effect.Effect<unknown>
  /** Deliveries received and not yet taken. */
  readonly pending: Effect.Effect<number>
  /** Completes when the actor (or another one) asked the edge to close this socket. */
  readonly closedByService: Effect.Effect<{ readonly code: number; readonly reason: string }>
  /** The socket closes on the client's side: the actor hears `closed`, as from an edge. */
  readonly close: (code?: number, reason?: string) => Effect.Effect<void>
  /** Completes once the actor has ended (its `onClosed` ran and its host forgot the connection). */
  readonly ended: Effect.Effect<void>
}

/** A JSON-RPC message as a test reads it from what an actor delivered. */
export interface JsonRpcMessage {
  readonly jsonrpc?: string
  readonly id?: string | number | null
  readonly method?: string
  readonly params?: Record<string, unknown>
  readonly result?: Record<string, unknown>
  readonly error?: { readonly code: number; readonly message: string }
}

/** The next message the actor delivered to the socket, as JSON-RPC. */
export const nextMessage = (client: ActorClient): Effect.Effect<JsonRpcMessage> => Effect.map(client.nextJson, (u) => u as JsonRpcMessage)

/** The service refused the connection at open time (`Actors.Refuse`). */
export class Refused extends Schema.TaggedError<Refused>()("Refused", { code: Schema.Number, reason: Schema.String }) {}

const encodeHeartbeat = Schema.encodeSync(Schema.parseJson(Edge.EdgeHeartbeat))

/**
 * Opens a connection to `service`'s actors and returns a client for it, closed (as a socket
 * closes, code 1000) when the scope ends unless the test or the service closed it before.
 */
export const open = (service: Subjects.ServiceName, options: OpenOptions) =>
  Effect.gen(function*() {
    const bus = yield* Bus.Bus
    const kv = yield* Kv.Kv
    const conn = options.conn ?? Subjects.ConnId(randomUUID())
    const edge = options.edge ?? Subjects.EdgeId(`test-edge-${randomUUID()}`)
    const deliveries = yield* Queue.unbounded<Delivery>()
    const closedByService = yield* Deferred.make<{ readonly code: number; readonly reason: string }>()
    let socketClosed = false
    const runFork = yield* FiberSet.makeRuntime<never>()

    // A host closes the connections of an edge whose heartbeat key is missing: beat as an edge does.
    const edges = yield* Effect.orDie(kv.bucket(Subjects.Bucket.edges))
    yield* edges.put(Subjects.Key.edge(edge), encodeHeartbeat({ startedAt: Date.now(), connections: 1 })).pipe(
      Effect.orDie,
      Effect.repeat(Schedule.spaced("2 seconds")),
      Effect.forkScoped
    )

    const subject = Subjects.conn(service, conn)
    const tellClosed = (code: number, reason: string) =>
      Effect.suspend(() => {
        if (socketClosed) return Effect.void
        socketClosed = true
        return bus.publish(subject, "", {
          [Subjects.Header.op]: "closed",
          [Subjects.Header.conn]: conn,
          [Subjects.Header.edge]: edge,
          [Subjects.Header.code]: String(code),
          [Subjects.Header.reason]: reason
        }).pipe(Effect.orDie)
      })

    const addressed = (m: Bus.BusMessage) =>
      m.header(Subjects.Header.conn) === conn || (m.header(Subjects.Header.conns)?.split(",").includes(conn) ?? false)

    // Subscribed before the open request: an actor may send as soon as it is made.
    yield* Effect.orDie(bus.subscribe(Subjects.edgeOut(edge), (m) => {
      if (!addressed(m)) return
      const op = m.header(Subjects.Header.op)
      if (op === "deliver") {
        Queue.unsafeOffer(deliveries, {
          text: Bus.text(m),
          traceparent: m.header(Subjects.Header.traceparent),
          http: m.header(Subjects.Header.http),
          end: m.header(Subjects.Header.httpEnd) === "1",
          eventId: m.header(Subjects.Header.eventId)
        })
      } else if (op === "close") {
        const code = Number(m.header(Subjects.Header.code) ?? 1005)
        const reason = m.header(Subjects.Header.reason) ?? ""
        Deferred.unsafeDone(closedByService, Exit.succeed({ code, reason }))
        // The edge closes the socket, then tells the actor, as it does for any close.
        runFork(tellClosed(code, reason))
      }
    }))

    const claims = options.claims ?? (options.user === undefined ? undefined : { sub: options.user })
    const event: Edge.OpenEvent = {
      path: options.path,
      query: { ...options.query },
      ...(options.origin === undefined ? {} : { origin: options.origin }),
      ...(claims === undefined ? {} : { claims }),
      openedAt: Date.now(),
      ...(options.transport === undefined ? {} : { transport: options.transport })
    }
    yield* Actors.requestOpen(bus, service, conn, edge, event, options.timeout ?? "5 seconds").pipe(
      Effect.catchTag("OpenRefused", (e) => new Refused({ code: e.code, reason: e.reason })),
      Effect.catchTags({ PeerTimeout: Effect.die, PeerUnavailable: Effect.die })
    )
    // The actor's host removes the connection's record once its actor ended: a test that closes a
    // socket can wait for that instead of guessing, and the scope ends with no actor left running.
    const connections = yield* Effect.orDie(kv.bucket(Subjects.Bucket.connections))
    const ended = connections.get(conn).pipe(
      Effect.orDie,
      Effect.flatMap((found) => (Option.isNone(found) ? Effect.void : Effect.fail("running"))),
      Effect.retry({ schedule: Schedule.spaced("5 millis"), times: 1_000 }),
      Effect.orDieWith(() => new Error(`the actor of ${conn} did not end within 5 s of its close`))
    )
    yield* Effect.addFinalizer(() => tellClosed(1000, "test scope closed").pipe(Effect.zipRight(ended), Effect.ignore))

    const base = {
      [Subjects.Header.op]: "frame",
      [Subjects.Header.conn]: conn,
      [Subjects.Header.edge]: edge,
      ...(claims === undefined ? {} : { [Subjects.Header.user]: claims.sub })
    }
    const send = (frame: string | object, o: FrameOptions = {}) =>
      bus.publish(subject, typeof frame === "string" ? frame : JSON.stringify(frame), {
        ...base,
        ...(o.limited === true ? { [Subjects.Header.reason]: "rate-limited" } : {}),
        ...(o.traceparent === undefined ? {} : { [Subjects.Header.traceparent]: o.traceparent }),
        ...(o.http === undefined ? {} : { [Subjects.Header.http]: o.http }),
        ...(o.user === undefined ? {} : { [Subjects.Header.user]: o.user }),
        ...(o.httpOp === undefined ? {} : { [Subjects.Header.httpOp]: o.httpOp }),
        ...(o.lastEventId === undefined ? {} : { [Subjects.Header.lastEventId]: o.lastEventId })
      }).pipe(Effect.orDie)

    const next = Queue.take(deliveries)
    return {
      conn,
      edge,
      send,
      next,
      nextJson: Effect.map(next, (d): unknown => JSON.parse(d.text)),
      pending: Queue.size(deliveries),
      closedByService: Deferred.await(closedByService),
      close: (code = 1000, reason = "") => tellClosed(code, reason),
      ended
    } satisfies ActorClient
  })

/** `open`, for a test that expects the service to refuse: the refusal, or none when it accepted. */
export const refusal = (service: Subjects.ServiceName, options: OpenOptions): Effect.Effect<Option.Option<Refused>, never, Bus.Bus | Kv.Kv | Scope.Scope> =>
  open(service, options).pipe(
    Effect.as(Option.none<Refused>()),
    Effect.catchTag("Refused", (r) => Effect.succeed(Option.some(r)))
  )
