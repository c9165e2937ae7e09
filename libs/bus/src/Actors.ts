/**
 * The service side of the edge protocol: one actor per connection. A connection's `open` request
 * reaches one replica through the service's queue group; that replica subscribes to the
 * connection's subject, records ownership in KV, and only then answers, so the edge never sends a
 * frame before someone listens. Frames are handled in order, one at a time, per actor.
 *
 * This module is the public API and composes the pieces: the record of each hosted connection
 * (`HostedActor.ts`), the mailbox (`Mailbox.ts`), the link to the edges (`EdgeLink.ts`), liveness
 * (`Liveness.ts`: heartbeat, adoption, edge loss), what KV keeps of a connection
 * (`SessionStore.ts`) and the hand-off (`Handoff.ts`).
 */
import { Edge, Host } from "@switchboard/protocol"
import * as Instruments from "@switchboard/telemetry/Instruments"
import { Metrics } from "@switchboard/telemetry/Metrics"
import * as Duration from "effect/Duration"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as FiberSet from "effect/FiberSet"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import { Bus, type BusMessage } from "./Bus.ts"
import { closeSocket, edgeIdOf, endActor, type Frame, opens as openRequests, socket } from "./EdgeLink.ts"
import * as Handoff from "./Handoff.ts"
import { annotated, type HostContext, HostedActor, HostedActors } from "./HostedActor.ts"
import { Kv } from "./Kv.ts"
import * as Liveness from "./Liveness.ts"
import { Mailbox } from "./Mailbox.ts"
import type * as Peer from "./Peer.ts"
import { connectionRecords, ownership } from "./SessionStore.ts"
import * as Subjects from "./Subjects.ts"

export { edgeLink, type Frame, type HttpExchange, opens, requestOpen, type Socket, unsafeRequestOpen } from "./EdgeLink.ts"
export type { HandoffCounts } from "./Handoff.ts"
export { ConnectionRecord, connectionRecords, sessionStore } from "./SessionStore.ts"

export interface Connection extends Peer.Sender {
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
}

/**
 * What an actor does with its mailbox, one message at a time. A handler that finishes its work
 * synchronously returns nothing, and the host runs no Effect for that message: most frames of a
 * busy connection are handled this way.
 */
export interface Actor<R = never, M = never, S = never> {
  readonly onFrame: (frame: Frame) => Effect.Effect<void, never, R> | void
  /** A message of the host's typed `protocol` from another actor, and the reply to it when it was asked. */
  readonly receive?: (message: M, reply: Peer.ReplyTo) => Effect.Effect<void, never, R> | void
  readonly onClosed?: (code: number, reason: string) => Effect.Effect<void, never, R>
  /**
   * Its replica stops and hands the connection to another: what it keeps only in memory (requests
   * in flight), of the host's `handoff.state` Schema, for `make`'s `handedOver` there. Its mailbox
   * is handled up to here, and what it keeps in KV is saved.
   */
  readonly onHandoff?: () => S
}

/** Refuse a connection at open time; the edge closes it with this code and reason. */
export class Refuse {
  readonly _tag = "Refuse"
  constructor(
    readonly code: number,
    readonly reason: string
  ) {}
}

export interface HostOptions<R, M extends Peer.Message = never, S = never, I = S> {
  readonly service: Subjects.ServiceName
  /** The typed messages this service's actors exchange (`Peer.protocol`); their `receive` gets them. */
  readonly protocol?: Peer.Protocol<M>
  /**
   * Builds the actor of a connection. Its scope lives as long as the connection, so
   * subscriptions and timers it opens end with it. `restored` is true when this replica adopts a
   * connection from one that stopped or died: the actor rebuilds its state from KV and does not
   * greet the client again. `handedOver` is what the actor had in memory there, when it was
   * handed over (decoded with `handoff.state`).
   */
  readonly make: (connection: Connection, restored: boolean, handedOver?: NoInfer<S>) => Effect.Effect<Actor<R, M, NoInfer<S>>, Refuse, R | Scope.Scope>
  /** How often to look for connections whose edge died without saying so. */
  readonly edgeCheckInterval?: Duration.DurationInput
  /** How often a replica renews its liveness key; survivors adopt its connections once it lapses (3 intervals). */
  readonly replicaHeartbeat?: Duration.DurationInput
  /** This replica's id, when the service needs it too (its liveness key is `Key.replica(service, id)`). */
  readonly replica?: string
  /**
   * How long this replica may take, when it stops, to hand its connections to the others; what
   * is not handed over by then is adopted from KV as after a crash.
   */
  readonly shutdownGrace?: Duration.DurationInput
  /**
   * Whether a stopping replica hands its actors over (default: yes, with nothing kept in memory).
   * A service whose actors depend on other state of the replica (the broker's topic sequencers)
   * opts out with `false` until it releases that state first; its actors are then adopted from KV
   * as after a crash. A service whose actors keep state only in memory (`onHandoff`) declares its
   * Schema as `state`: the host encodes it for the adopter, which decodes it; one that does not
   * decode there is refused with a log line, and the connection is adopted from KV instead.
   */
  readonly handoff?: false | { readonly state: Schema.Schema<S, I> }
  /**
   * What the service does, when this replica stops, before its actors move: it runs once the
   * replica takes no new connections and before any is handed over (the broker hands its topics
   * on here, so that handed-over participants join a sequencer that stays).
   */
  readonly beforeHandoff?: Effect.Effect<void>
}

/** Hosts the actors of one service until the scope closes. */
export const host = <R, M extends Peer.Message = never, S = never, I = S>(options: HostOptions<R, M, S, I>) =>
  Effect.gen(function*() {
    const bus = yield* Bus
    const kv = yield* Kv
    const heartbeat = Duration.decode(options.replicaHeartbeat ?? "2 seconds")
    const connections = ownership(connectionRecords(yield* kv.bucket(Subjects.Bucket.connections)))
    const edges = yield* kv.bucket(Subjects.Bucket.edges)
    const replicas = yield* kv.bucket(Subjects.Bucket.replicas)
    yield* Liveness.checkHeartbeat(heartbeat)
    const replica = options.replica ?? randomUUID()
    const meter = Instruments.actorHost(yield* Metrics, options.service)
    /** Every connection this replica hosts, one record each (`HostedActor`). */
    const actors = new HostedActors<R, M>()
    yield* Effect.acquireRelease(Effect.sync(() => meter.follow(() => actors.opens())), (stop) => Effect.sync(stop))
    /**
     * What ends each actor whose mailbox runs, as this replica stops, without `onClosed`: its
     * state stays in KV for the replica that adopts it. Registered before `fibers`, so it runs
     * once the handlers in flight are interrupted.
     */
    yield* Effect.addFinalizer(() => Effect.fiberIdWith((id) => Effect.forEach(actors.running(), (actor) => actor.stop(id), { discard: true })))
    const fibers = yield* FiberSet.make()
    const runFork = yield* FiberSet.runtime(fibers)<R>()
    /** Inboxes of this replica that are no connection's actor (`inbox`), reached by peer messages alike. */
    const inboxes = new Map<Subjects.ConnId, Inbox>()
    const route: Peer.Route = { bus, service: options.service, local: (target) => actors.local(target) ?? inboxes.get(target) }

    /** Actors being built; a stopping replica waits for them before it hands its actors over. */
    let starting = 0
    const counts: Handoff.HandoffCounts = { handedOver: 0, adopted: 0, failed: 0 }
    const grace = Duration.decode(options.shutdownGrace ?? "10 seconds")
    const queue = Subjects.Queue.service(options.service)
    const stateSchema = options.handoff === false ? undefined : options.handoff?.state
    const encodeState = stateSchema === undefined ? undefined : Schema.encodeUnknown(stateSchema)
    const decodeState = stateSchema === undefined ? undefined : Schema.decodeUnknownEither(stateSchema)
    const context: HostContext<R, M> = {
      service: options.service,
      runFork,
      actors,
      removeRecord: connections.remove,
      encodeState: (state) =>
        state === undefined || encodeState === undefined
          ? Effect.succeed(undefined)
          : Effect.mapError(encodeState(state), (e) => new Handoff.HandoffFailed("State", `its state does not encode: ${e.message}`))
    }

    /** A hand-off's adopter: the state the actor had in memory, and the answer the old owner waits for. */
    type Adoption = { readonly state: S | undefined; readonly claim: Effect.Effect<boolean> }

    /** An actor's handle on its connection; built out here, so that its closures hold only these. */
    const connectionOf = (connId: Subjects.ConnId, edgeId: Subjects.EdgeId, event: Edge.OpenEvent, http: boolean): Connection => ({
      id: connId,
      edge: edgeId,
      open: event,
      user: event.claims?.sub,
      send: socket(bus, edgeId, { _tag: "Deliver", conn: connId }).send,
      route,
      close: http
        ? (code, reason) => endActor(bus, options.service, connId, code, reason)
        : (code, reason) => closeSocket(bus, edgeId, connId, code, reason)
    })

    /**
     * Runs one connection's actor in a fiber of its own: subscribe, build, then record it
     * (`HostedActor`) and start its mailbox. `answer` tells the edge (on open), or the replica
     * handing it over, whether the actor took the connection. The fiber ends once the mailbox runs.
     */
    const run = (
      connId: Subjects.ConnId,
      edgeId: Subjects.EdgeId,
      event: Edge.OpenEvent,
      restored: boolean,
      /** `undefined` when the actor took the connection. */
      answer: (refused: Host.OpenRefused | undefined) => Effect.Effect<void>,
      adoption?: Adoption
    ) => {
      const mailbox = new Mailbox<R>(runFork)
      // A Streamable HTTP session outlives any edge: a dead edge's sweep must not end it.
      const http = event.transport === "http"
      const subject = Subjects.conn(options.service, connId)
      starting++
      let started = false
      const ready = () => {
        if (!started) starting--
        started = true
      }
      // The actor's scope: what it opens (subscriptions, timers, views) ends with the connection.
      return runFork(Effect.flatMap(Scope.make(), (scope) => Effect.gen(function*() {
        // In the actor's scope at once: each Scope.extend copies the fiber's refs twice.
        const [subscription, made] = yield* Scope.extend(
          Effect.gen(function*() {
            // A queue group of one, but for a hand-off, when the old and the new owner share it.
            // Bound rather than a closure here, which would keep this function's variables alive.
            const subscription = yield* bus.subscribe(subject, mailbox.offer.bind(mailbox), { queue })
            // The old owner leaves once this returns: the server must know the new member by then.
            if (adoption !== undefined) yield* bus.flush
            return [subscription, yield* Effect.exit(options.make(connectionOf(connId, edgeId, event, http), restored, adoption?.state))] as const
          }),
          scope
        )
        const claimed = Exit.isSuccess(made) && adoption !== undefined ? yield* adoption.claim : true
        if (Exit.isFailure(made) || !claimed) {
          const refusal = Exit.isSuccess(made)
            ? new Refuse(Edge.CloseCode.InternalError, "another replica owns the connection")
            : made.cause._tag === "Fail"
            ? made.cause.error
            : new Refuse(Edge.CloseCode.InternalError, "could not start the session")
          yield* answer(new Host.OpenRefused({ code: refusal.code, reason: refusal.reason }))
          yield* Scope.close(scope, Exit.void)
          return false
        }
        const actorMade = made.value
        const onPeer = options.protocol !== undefined && actorMade.receive !== undefined ? options.protocol.inbox(bus, actorMade.receive) : undefined
        const actor = new HostedActor(context, connId, edgeId, event, http, mailbox, subscription, scope, actorMade, onPeer)
        // What reached the old owner after it paused comes first, then what came here: the
        // forward may arrive as soon as the old owner hears the answer.
        const forwarded = adoption === undefined ? undefined : yield* Deferred.make<ReadonlyArray<BusMessage>>()
        if (forwarded !== undefined) actor.awaitForward((messages) => Deferred.unsafeDone(forwarded, Exit.succeed(messages)))
        actors.add(actor)
        ready()
        yield* answer(undefined)
        if (forwarded !== undefined) {
          const messages = yield* Deferred.await(forwarded).pipe(
            Effect.timeout(grace),
            Effect.tapError(() => Effect.logWarning("the replica that handed this connection over forwarded nothing; starting without")),
            Effect.orElseSucceed((): ReadonlyArray<BusMessage> => [])
          )
          mailbox.prepend(messages)
        }
        actor.begin()
        return true
      }).pipe(
        // The actor runs on without this fiber once its mailbox started; otherwise it ends here.
        Effect.onExit((exit) =>
          Exit.isSuccess(exit) && exit.value
            ? Effect.void
            : Effect.zipRight(Exit.isSuccess(exit) ? Effect.void : Scope.close(scope, exit), Effect.sync(() => actors.forget(connId, mailbox)))
        ),
        Effect.ensuring(Effect.sync(ready)),
        Effect.catchAllCause((cause) => Effect.logError("actor failed", cause))
      )), annotated(options.service, connId))
    }

    const record = (connId: Subjects.ConnId, edgeId: Subjects.EdgeId, event: Edge.OpenEvent) =>
      connections.record(connId, { service: options.service, replica, edge: edgeId, open: event })

    // What comes in through the service's queue groups (new connections, hand-offs) stops first
    // when this replica stops, so that its own hand-off requests go to the others.
    const intake = yield* Effect.acquireRelease(Scope.make(), (s) => Scope.close(s, Exit.void))
    const opens = yield* Scope.extend(
      openRequests.serve(
        Subjects.open(options.service),
        (request, replyTo) => {
          const reply = replyTo(request)
          const id = Subjects.ConnId(request.conn)
          const edge = edgeIdOf(request.edge)
          // Ownership is recorded before the edge hears "ok", so a replica that dies right after
          // still leaves a record to adopt.
          run(id, edge, request.event, false, (refused) =>
            refused === undefined ? Effect.zipRight(record(id, edge, request.event), reply.succeed(undefined)) : reply.fail(refused))
        },
        { queue }
      ),
      intake
    )

    // --- hand-off: adopting a stopping replica's connections, and handing ours over ---------

    const adoptions = yield* Scope.extend(
      Handoff.adoptions.serve(
        Subjects.handoff(options.service),
        (request, replyTo) => {
          const reply = replyTo(request)
          const { conn, edge, from, open } = request
          // Decoded before anything is taken on: a state this replica cannot read (another
          // version's, say) leaves the connection to adoption from KV rather than failing its actor.
          const state = request.state === undefined || decodeState === undefined ? Either.right(undefined) : decodeState(request.state)
          if (Either.isLeft(state)) {
            return runFork(
              Effect.zipRight(
                Effect.logWarning(`refused to adopt ${conn}: its hand-off state does not match this service's Schema`, state.left.message),
                reply.fail(new Host.AdoptRefused({ reason: "the hand-off state does not match this service's Schema" }))
              )
            )
          }
          const claim = connections.claim(conn, from, replica)
          run(Subjects.ConnId(conn), edgeIdOf(edge), open, true, (refused) => {
            if (refused !== undefined) return reply.fail(new Host.AdoptRefused({ reason: refused.reason }))
            counts.adopted++
            return reply.succeed(replica)
          }, { state: state.right, claim })
        },
        { queue }
      ),
      intake
    )

    yield* Handoff.replicaInbox.serve(Subjects.replicaInbox(options.service, replica), (request, replyTo) => {
      switch (request._tag) {
        // Asked whether this replica still runs (its heartbeat key lapsed).
        case "Ping":
          return replyTo(request).succeed(replica)
        case "Forward": {
          const conn = Subjects.ConnId(request.conn)
          const subject = Subjects.conn(options.service, conn)
          actors.get(conn)?.forwarded(request.messages.map((f) => new Handoff.ForwardedMessage(subject, f)))
          return replyTo(request).succeed(undefined)
        }
      }
    })

    // --- liveness: this replica's heartbeat, and adoption of connections whose replica lapsed ---

    const { othersAlive } = yield* Liveness.start({
      bus,
      service: options.service,
      replica,
      heartbeat,
      edgeCheckInterval: options.edgeCheckInterval ?? "5 seconds",
      ownership: connections,
      edges,
      replicas,
      owns: (conn) => actors.owns(conn),
      socketsByEdge: () => actors.socketsByEdge(),
      adopted: (connId, found, answer) => {
        meter.adopted()
        run(connId, edgeIdOf(found.edge), found.open, true, answer)
      }
    })

    // Registered last, so it runs first when this replica stops: while its heartbeat still says it
    // is alive (no survivor adopts from KV meanwhile) and its actors still run.
    // Finalizers run uninterruptibly; the hand-off's timeouts and races must be able to interrupt.
    if (options.handoff !== false) {
      yield* Effect.addFinalizer(() =>
        Handoff.handOverAll({
          bus,
          service: options.service,
          replica,
          grace,
          stopIntake: Effect.all([opens.drain, adoptions.drain], { concurrency: "unbounded", discard: true }),
          starting: () => starting,
          beforeHandoff: options.beforeHandoff,
          actors: () => actors.owned(),
          handedOff: (h) => {
            counts.handedOver++
            meter.handedOff()
            actors.get(h.conn)?.end("handed-over")
          },
          othersAlive,
          counts
        })
      )
    }

    yield* Effect.logInfo(`${options.service}: hosting connection actors (replica ${replica})`)
    return {
      replica,
      handoffs: counts as Readonly<Handoff.HandoffCounts>,
      /**
       * Takes the peer messages this replica's actors send to `id` as they are, in the sender's
       * turn, rather than over the bus, until the scope closes; messages from other replicas still
       * arrive on `id`'s subject, which the owner subscribes to itself.
       */
      inbox: (id: Subjects.ConnId, inbox: Inbox) =>
        Effect.acquireRelease(Effect.sync(() => void inboxes.set(id, inbox)), () => Effect.sync(() => void inboxes.delete(id)))
    }
  })

/** Where peer messages to an id that is no actor go within the replica (see `host`'s `inbox`). */
export interface Inbox {
  readonly offer: (message: BusMessage) => void
}
