/**
 * The service side of the edge protocol: one actor per connection. A connection's `open` request
 * reaches one replica through the service's queue group; that replica subscribes to the
 * connection's subject, records ownership in KV, and only then answers, so the edge never sends a
 * frame before someone listens. Frames are handled in order, one at a time, per actor.
 *
 * This module is the public API and composes the pieces: the mailbox (`Mailbox.ts`), the link to
 * the edges (`EdgeLink.ts`), liveness (`Liveness.ts`: heartbeat, adoption, edge loss), what KV
 * keeps of a connection (`SessionStore.ts`) and the hand-off (`Handoff.ts`).
 */
import { Edge, Host } from "@switchboard/protocol"
import * as Instruments from "@switchboard/telemetry/Instruments"
import { Metrics } from "@switchboard/telemetry/Metrics"
import * as Duration from "effect/Duration"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import * as FiberSet from "effect/FiberSet"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import { Bus, type BusMessage, type Subscription } from "./Bus.ts"
import { closedOf, closeSocket, endActor, type Frame, IncomingFrame, markerOf, opens as openRequests, socket } from "./EdgeLink.ts"
import * as Handoff from "./Handoff.ts"
import { Kv, typed } from "./Kv.ts"
import * as Liveness from "./Liveness.ts"
import { type Envelope, Mailbox } from "./Mailbox.ts"
import type * as Peer from "./Peer.ts"
import { ConnectionRecord, ownership } from "./SessionStore.ts"
import * as Subjects from "./Subjects.ts"

export { edgeLink, type Frame, type HttpExchange, opens, requestOpen, type Socket } from "./EdgeLink.ts"
export { ConnectionRecord, sessionStore } from "./SessionStore.ts"

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
export interface Actor<R = never, M = never> {
  readonly onFrame: (frame: Frame) => Effect.Effect<void, never, R> | void
  /** A message of the host's typed `protocol` from another actor, and the reply to it when it was asked. */
  readonly receive?: (message: M, reply: Peer.ReplyTo) => Effect.Effect<void, never, R> | void
  readonly onClosed?: (code: number, reason: string) => Effect.Effect<void, never, R>
  /**
   * Its replica stops and hands the connection to another: what it keeps only in memory (requests
   * in flight), as JSON, for `make`'s `handedOver` there. Its mailbox is handled up to here, and
   * what it keeps in KV is saved.
   */
  readonly onHandoff?: () => unknown
}

/** Refuse a connection at open time; the edge closes it with this code and reason. */
export class Refuse {
  readonly _tag = "Refuse"
  constructor(
    readonly code: number,
    readonly reason: string
  ) {}
}

export interface HostOptions<R, M extends Peer.Message = never> {
  readonly service: Subjects.ServiceName
  /** The typed messages this service's actors exchange (`Peer.protocol`); their `receive` gets them. */
  readonly protocol?: Peer.Protocol<M>
  /**
   * Builds the actor of a connection. Its scope lives as long as the connection, so
   * subscriptions and timers it opens end with it. `restored` is true when this replica adopts a
   * connection from one that stopped or died: the actor rebuilds its state from KV and does not
   * greet the client again.
   */
  readonly make: (connection: Connection, restored: boolean, handedOver?: unknown) => Effect.Effect<Actor<R, M>, Refuse, R | Scope.Scope>
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
   * Whether a stopping replica hands its actors over (default true). A service whose actors
   * depend on other state of the replica (the broker's topic sequencers) opts out until it
   * releases that state first; its actors are then adopted from KV as after a crash.
   */
  readonly handoff?: boolean
  /**
   * What the service does, when this replica stops, before its actors move: it runs once the
   * replica takes no new connections and before any is handed over (the broker hands its topics
   * on here, so that handed-over participants join a sequencer that stays).
   */
  readonly beforeHandoff?: Effect.Effect<void>
}

/** Hand-offs of one replica, for its metrics (`switchboard_handoffs_total{service}`). */
export interface HandoffCounts {
  /** Connections this replica handed to another as it stopped. */
  handedOver: number
  /** Connections another replica handed to this one. */
  adopted: number
  /** Connections this replica could not hand over as it stopped (left for adoption from KV). */
  failed: number
}

/** Hosts the actors of one service until the scope closes. */
export const host = <R, M extends Peer.Message = never>(options: HostOptions<R, M>) =>
  Effect.gen(function*() {
    const bus = yield* Bus
    const kv = yield* Kv
    const heartbeat = Duration.decode(options.replicaHeartbeat ?? "2 seconds")
    const connections = ownership(typed(yield* kv.bucket(Subjects.Bucket.connections), ConnectionRecord))
    const edges = yield* kv.bucket(Subjects.Bucket.edges)
    const replicas = yield* kv.bucket(Subjects.Bucket.replicas)
    yield* Liveness.checkHeartbeat(heartbeat)
    const replica = options.replica ?? randomUUID()
    const meter = Instruments.actorHost(yield* Metrics, options.service)
    /**
     * What ends each actor whose mailbox runs, as this replica stops, without `onClosed`: its
     * state stays in KV for the replica that adopts it. Registered before `fibers`, so it runs
     * once the handlers in flight are interrupted.
     */
    const live = new Map<Subjects.ConnId, { readonly stop: (interruptor: FiberId.FiberId) => Effect.Effect<void> }>()
    yield* Effect.addFinalizer(() => Effect.fiberIdWith((id) => Effect.forEach([...live.values()], (actor) => actor.stop(id), { discard: true })))
    const fibers = yield* FiberSet.make()
    const runFork = yield* FiberSet.runtime(fibers)<R>()
    /** Mailboxes by edge, so a dead edge's connections can be closed together. */
    const byEdge = new Liveness.ConnectionsByEdge<Mailbox<R>>()
    /** The mailboxes of this replica's actors, for peer messages that need not leave the process. */
    const owned = new Map<Subjects.ConnId, Mailbox<R>>()
    /** Inboxes of this replica that are no connection's actor (`inbox`), reached by peer messages alike. */
    const inboxes = new Map<Subjects.ConnId, Inbox>()
    const route: Peer.Route = { bus, service: options.service, local: (target) => owned.get(target) ?? inboxes.get(target) }

    /** This replica's actors, each as a hand-off needs it. */
    const hosted = new Map<Subjects.ConnId, Handoff.Handover<R>>()
    /** Actors adopted by hand-off whose mailbox waits for what the old owner forwards. */
    const awaitingForward = new Map<Subjects.ConnId, (forwarded: ReadonlyArray<BusMessage>) => void>()
    /** Ends a handed-over actor without `onClosed`. */
    const enders = new Map<Subjects.ConnId, { readonly end: (why: "handed-over") => void }>()
    /** Actors being built; a stopping replica waits for them before it hands its actors over. */
    let starting = 0
    const counts: HandoffCounts = { handedOver: 0, adopted: 0, failed: 0 }
    const grace = Duration.decode(options.shutdownGrace ?? "10 seconds")
    const queue = Subjects.Queue.service(options.service)

    /** A hand-off's adopter: the state the actor had in memory, and the answer the old owner waits for. */
    interface Adoption {
      readonly state: unknown
      readonly claim: Effect.Effect<boolean>
    }

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

    /** Forgets an actor everywhere in the host; harmless when done twice. */
    const forget = (connId: Subjects.ConnId, edgeId: Subjects.EdgeId, mailbox: Mailbox<R>) => {
      mailbox.stop()
      live.delete(connId)
      owned.delete(connId)
      hosted.delete(connId)
      enders.delete(connId)
      awaitingForward.delete(connId)
      byEdge.remove(edgeId, connId)
    }

    /**
     * What an actor is while its mailbox runs, until something ends it: its socket closed, its
     * edge is gone, it was handed over, or this replica stops. No fiber waits for that: a fiber
     * suspended for a connection's whole life, with its stack of continuations and its fiber refs,
     * was most of what an idle connection cost (issue 16). The end forks a fiber that runs
     * `onClosed` and closes the actor's scope. A class, so that every actor shares its methods
     * rather than holding closures of its own.
     */
    class LiveActor implements Handoff.Handover<R> {
      private marker: readonly [string, () => void] | undefined
      private ending = false
      /** Made only when a hand-off waits on it: a Deferred per idle actor cost about 600 bytes (issue 16). */
      private done: Deferred.Deferred<void> | undefined
      constructor(
        readonly conn: Subjects.ConnId,
        readonly edge: Subjects.EdgeId,
        readonly open: Edge.OpenEvent,
        readonly http: boolean,
        readonly mailbox: Mailbox<R>,
        readonly subscription: Subscription,
        private readonly scope: Scope.CloseableScope,
        private readonly actor: Actor<R, M>,
        /** The actor's typed `receive` behind the protocol's decoding. */
        private readonly onPeer: ((message: BusMessage) => Effect.Effect<void, never, R> | void) | undefined
      ) {}
      get ended() {
        return this.ending ? Effect.void : Deferred.await(this.done ??= Deferred.unsafeMake<void>(FiberId.none))
      }
      state() {
        return this.actor.onHandoff?.()
      }
      expectMarker(token: string, reached: () => void) {
        this.marker = [token, reached]
      }
      disown() {
        owned.delete(this.conn)
        hosted.delete(this.conn)
      }
      /** Handles the mailbox from here on (with what arrived before); the actor ends through `end` now. */
      begin() {
        live.set(this.conn, this)
        this.mailbox.start((m) => this.handle(m))
      }
      private handle(m: Envelope): Effect.Effect<void, never, R> | void {
        if (m === "edge-lost") return this.end([1006, "edge lost"])
        const op = m.header(Subjects.Header.op)
        if (op === "frame") return this.actor.onFrame(new IncomingFrame(m))
        if (op === "peer") return this.onPeer?.(m)
        if (op === "closed") {
          this.end(closedOf(m))
        } else if (op === "marker" && this.marker !== undefined && this.marker[0] === markerOf(m)) {
          // Every frame the edge sent before it is handled: stop here; the rest goes to the adopter.
          this.mailbox.pause(this.marker[1])
        }
      }
      /** Its last message was handled: `onClosed` and its record are left, in a fiber of its own. */
      end(why: readonly [number, string] | "handed-over") {
        if (this.ending) return
        this.ending = true
        if (this.done !== undefined) Deferred.unsafeDone(this.done, Exit.void)
        runFork(this.close(why))
      }
      private close(why: readonly [number, string] | "handed-over") {
        const { actor, conn } = this
        return Effect.suspend(() => {
          // Stopped here and not in `end`: `end` may run inside the mailbox's own drain.
          this.mailbox.stop()
          // Handed over: the adopter owns the connection, its record and its session now.
          if (why === "handed-over") return Effect.void
          return Effect.zipRight(
            actor.onClosed === undefined ? Effect.void : actor.onClosed(...why),
            connections.remove(conn)
          )
        }).pipe(
          Effect.onExit((exit) => Scope.close(this.scope, exit)),
          Effect.ensuring(Effect.sync(() => forget(this.conn, this.edge, this.mailbox))),
          Effect.annotateLogs({ service: options.service, conn }),
          Effect.catchAllCause((cause) => Effect.logError("actor failed", cause))
        )
      }
      /** This replica stops and could not hand it over: it ends interrupted, without `onClosed`; its state stays in KV. */
      stop(interruptor: FiberId.FiberId) {
        return Effect.zipRight(Scope.close(this.scope, Exit.interrupt(interruptor)), Effect.sync(() => forget(this.conn, this.edge, this.mailbox)))
      }
    }

    /**
     * Runs one connection's actor: subscribe, build, then hand its mailbox to a `LiveActor`.
     * `answer` tells the edge (on open), or the replica handing it over, whether the actor took
     * the connection. This fiber ends once the mailbox runs.
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
      return Effect.flatMap(Scope.make(), (scope) => Effect.gen(function*() {
        // A queue group of one, but for a hand-off, when the old and the new owner share it.
        // Bound rather than a closure here, which would keep this function's variables alive.
        const subscription = yield* Scope.extend(bus.subscribe(subject, mailbox.offer.bind(mailbox), { queue }), scope)
        // The old owner leaves once this returns: the server must know the new member by then.
        if (adoption !== undefined) yield* bus.flush
        const made = yield* Effect.exit(Scope.extend(options.make(connectionOf(connId, edgeId, event, http), restored, adoption?.state), scope))
        const claimed = Exit.isSuccess(made) && adoption !== undefined ? yield* adoption.claim : true
        if (Exit.isFailure(made) || !claimed) {
          const refusal = Exit.isFailure(made)
            ? Exit.causeOption(made).pipe(Option.flatMap((cause) => (cause._tag === "Fail" ? Option.some(cause.error) : Option.none())))
            : Option.some(new Refuse(Edge.CloseCode.InternalError, "another replica owns the connection"))
          yield* answer(
            Option.match(refusal, {
              onNone: () => new Host.OpenRefused({ code: Edge.CloseCode.InternalError, reason: "could not start the session" }),
              onSome: (r) => new Host.OpenRefused({ code: r.code, reason: r.reason })
            })
          )
          yield* Scope.close(scope, Exit.void)
          return false
        }
        const actorMade = made.value
        const onPeer = options.protocol !== undefined && actorMade.receive !== undefined ? options.protocol.inbox(bus, actorMade.receive) : undefined
        if (!http) byEdge.add(edgeId, connId, mailbox)
        owned.set(connId, mailbox)
        yield* meter.hosting(event, scope)
        const actor = new LiveActor(connId, edgeId, event, http, mailbox, subscription, scope, actorMade, onPeer)
        hosted.set(connId, actor)
        enders.set(connId, actor)
        // What reached the old owner after it paused comes first, then what came here: the
        // forward may arrive as soon as the old owner hears the answer.
        const forwarded = adoption === undefined ? undefined : yield* Deferred.make<ReadonlyArray<BusMessage>>()
        if (forwarded !== undefined) awaitingForward.set(connId, (messages) => Deferred.unsafeDone(forwarded, Exit.succeed(messages)))
        ready()
        yield* answer(undefined)
        if (forwarded !== undefined) {
          const messages = yield* Deferred.await(forwarded).pipe(
            Effect.timeout(grace),
            Effect.tapError(() => Effect.logWarning("the replica that handed this connection over forwarded nothing; starting without")),
            Effect.orElseSucceed((): ReadonlyArray<BusMessage> => [])
          )
          awaitingForward.delete(connId)
          mailbox.prepend(messages)
        }
        actor.begin()
        return true
      }).pipe(
        // The actor runs on without this fiber once its mailbox started; otherwise it ends here.
        Effect.onExit((exit) =>
          Exit.isSuccess(exit) && exit.value
            ? Effect.void
            : Effect.zipRight(Exit.isSuccess(exit) ? Effect.void : Scope.close(scope, exit), Effect.sync(() => forget(connId, edgeId, mailbox)))
        ),
        Effect.ensuring(Effect.sync(ready)),
        Effect.annotateLogs({ service: options.service, conn: connId }),
        Effect.catchAllCause((cause) => Effect.logError("actor failed", cause))
      ))
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
          const edge = Subjects.EdgeId(request.edge)
          // Ownership is recorded before the edge hears "ok", so a replica that dies right after
          // still leaves a record to adopt.
          runFork(
            run(id, edge, request.event, false, (refused) =>
              refused === undefined ? Effect.zipRight(record(id, edge, request.event), reply.succeed(undefined)) : reply.fail(refused))
          )
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
          const { conn, edge, from, open, state } = request
          const claim = connections.claim(conn, from, replica)
          runFork(
            run(Subjects.ConnId(conn), Subjects.EdgeId(edge), open, true, (refused) => {
              if (refused !== undefined) return reply.fail(new Host.AdoptRefused({ reason: refused.reason }))
              counts.adopted++
              return reply.succeed(replica)
            }, { state, claim })
          )
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
          awaitingForward.get(conn)?.(request.messages.map((f) => new Handoff.ForwardedMessage(subject, f)))
          return replyTo(request).succeed(undefined)
        }
      }
    })

    /** Hands every actor to the others; whatever is not handed over in time stays for adoption. */
    const handOverAll = Effect.gen(function*() {
      yield* Effect.all([opens.drain, adoptions.drain], { concurrency: "unbounded", discard: true })
      // Opens that reached this replica before it left the queue group may still be starting.
      const deadline = Date.now() + Duration.toMillis(grace) / 2
      while (starting > 0 && Date.now() < deadline) yield* Effect.sleep("5 millis")
      if (options.beforeHandoff !== undefined) yield* options.beforeHandoff
      const all = [...hosted.values()]
      if (all.length === 0) return
      // Counted as each ends: a batch cut short by the grace still says how many went over, and why
      // the others did not (a "handed 0 of 7" from a batch that timed out said neither).
      // Asked again by every hand-off that finds nobody listening: one listing serves them all a while.
      const survivorExpected = yield* Effect.cachedWithTTL(othersAlive, "250 millis")
      let handed = 0
      const failures = new Map<string, number>()
      const failed = (why: string) => Effect.sync(() => void failures.set(why, (failures.get(why) ?? 0) + 1))
      yield* Effect.forEach(
        all,
        (h) =>
          Handoff.handOver(bus, options.service, replica, h, grace, survivorExpected).pipe(
            Effect.tap(() =>
              Effect.sync(() => {
                handed++
                counts.handedOver++
                meter.handedOff()
                enders.get(h.conn)?.end("handed-over")
              })
            ),
            Effect.catchAll((e) => Effect.zipRight(failed(e.reason), Effect.logDebug(`could not hand ${h.conn} over: ${e.message}`))),
            Effect.catchAllDefect((d) => Effect.zipRight(failed("Defect"), Effect.logWarning("hand-off failed", d)))
          ),
        { concurrency: 256, discard: true }
      ).pipe(
        // A finalizer runs uninterruptibly, as it must on SIGTERM, where its fiber is being
        // interrupted; only the hand-offs themselves may be cut short, by the grace period.
        Effect.interruptible,
        Effect.timeout(grace),
        Effect.ignore
      )
      counts.failed += all.length - handed
      if (handed === all.length) yield* Effect.logInfo(`handed ${handed} connections over to other replicas`)
      else {
        const unfinished = all.length - handed - [...failures.values()].reduce((a, b) => a + b, 0)
        if (unfinished > 0) failures.set("Grace", unfinished)
        const why = [...failures].map(([reason, n]) => `${reason} ${n}`).join(", ")
        // On a bus no other process shares (npm start's embedded one), no replica elsewhere will
        // adopt what is left: the connections just end with the process, as the user asked.
        yield* (bus.shared ? Effect.logWarning : Effect.logDebug)(
          `handed ${handed} of ${all.length} connections over (not handed: ${why}); the other ${all.length - handed} are adopted from KV once this replica's heartbeat lapses`
        )
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
      owns: (conn) => owned.has(conn),
      byEdge,
      adopted: (connId, found) => {
        meter.adopted()
        runFork(run(connId, Subjects.EdgeId(found.edge), found.open, true, () => Effect.void))
      }
    })

    // Registered last, so it runs first when this replica stops: while its heartbeat still says it
    // is alive (no survivor adopts from KV meanwhile) and its actors still run.
    // Finalizers run uninterruptibly; the hand-off's timeouts and races must be able to interrupt.
    if (options.handoff !== false) yield* Effect.addFinalizer(() => handOverAll)

    yield* Effect.logInfo(`${options.service}: hosting connection actors (replica ${replica})`)
    return {
      replica,
      handoffs: counts as Readonly<HandoffCounts>,
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
