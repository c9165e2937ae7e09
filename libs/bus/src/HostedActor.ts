/**
 * What the actor host keeps of each connection it hosts, as one record: the actor, its mailbox,
 * subscription and scope, and where it is in its life (running, handed away, waiting for what the
 * old owner forwards). One map of these records (`HostedActors`) is all the host holds per
 * connection, so forgetting a connection is one delete and nothing of it is left in another map.
 */
import type { Edge } from "@switchboard/protocol"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import type * as Fiber from "effect/Fiber"
import * as FiberId from "effect/FiberId"
import * as FiberRef from "effect/FiberRef"
import * as FiberRefs from "effect/FiberRefs"
import * as HashMap from "effect/HashMap"
import type * as Runtime from "effect/Runtime"
import * as Scope from "effect/Scope"
import type { BusMessage, Subscription } from "./Bus.ts"
import { closedOf, type Frame, IncomingFrame, markerOf } from "./EdgeLink.ts"
import type { Handover, HandoffFailed } from "./Handoff.ts"
import type { Envelope, Mailbox } from "./Mailbox.ts"
import type * as Peer from "./Peer.ts"
import * as Subjects from "./Subjects.ts"

/** What a hosted actor does with its mailbox; `Actors.Actor`, with its hand-off state already typed away. */
export interface ActorBehaviour<R, M> {
  readonly onFrame: (frame: Frame) => Effect.Effect<void, never, R> | void
  readonly onClosed?: (code: number, reason: string) => Effect.Effect<void, never, R>
  readonly onHandoff?: () => unknown
  readonly receive?: (message: M, reply: Peer.ReplyTo) => Effect.Effect<void, never, R> | void
}

/** What every record of one host shares: the host's own pieces, held once rather than per actor. */
export interface HostContext<R, M> {
  readonly service: Subjects.ServiceName
  readonly runFork: (effect: Effect.Effect<void, never, R>, options?: Runtime.RunForkOptions) => Fiber.RuntimeFiber<void, never>
  readonly actors: HostedActors<R, M>
  /** The actor closed: its ownership record in KV goes, so that nobody adopts it. */
  readonly removeRecord: (conn: Subjects.ConnId) => Effect.Effect<void>
  /** The actor's in-memory state as the service's hand-off Schema encodes it. */
  readonly encodeState: (state: unknown) => Effect.Effect<unknown, HandoffFailed>
}

/**
 * Forks a connection's fiber with its log annotations in place. `Effect.annotateLogs` around an
 * actor's open cost about 11 KB of allocations per connection (a copy of the fiber's refs as it
 * sets them and another as it restores them, and the acquire-use-release between: issue 29).
 */
export const annotated = (service: string, conn: string): Runtime.RunForkOptions => ({
  updateRefs: (refs, fiberId) => {
    const about = HashMap.set(HashMap.set(FiberRefs.getOrDefault(refs, FiberRef.currentLogAnnotations), "service", service), "conn", conn)
    return FiberRefs.updateAs(refs, { fiberId, fiberRef: FiberRef.currentLogAnnotations, value: about })
  }
})

/**
 * One hosted connection, from the moment its actor is made until it is forgotten. While its
 * mailbox runs, it is what the actor is until something ends it: its socket closed, its edge is
 * gone, it was handed over, or this replica stops. No fiber waits for that: a fiber suspended for
 * a connection's whole life was most of what an idle connection cost (issue 16). The end forks a
 * fiber that runs `onClosed` and closes the actor's scope. A class, so that every actor shares its
 * methods rather than holding closures of its own.
 */
export class HostedActor<R, M> implements Handover<R> {
  private marker: readonly [string, () => void] | undefined
  private ending = false
  /** Made only when a hand-off waits on it: a Deferred per idle actor cost about 600 bytes (issue 16). */
  private done: Deferred.Deferred<void> | undefined
  /** Local peers write into its mailbox; false once it is handed to another replica. */
  owned = true
  /** Its mailbox runs (`begin`): a stopping replica ends it. */
  running = false
  /** Adopted by hand-off: takes what the old owner forwards, once. */
  private forward: ((messages: ReadonlyArray<BusMessage>) => void) | undefined
  constructor(
    private readonly host: HostContext<R, M>,
    readonly conn: Subjects.ConnId,
    readonly edge: Subjects.EdgeId,
    readonly open: Edge.OpenEvent,
    readonly http: boolean,
    readonly mailbox: Mailbox<R>,
    readonly subscription: Subscription,
    private readonly scope: Scope.CloseableScope,
    private readonly actor: ActorBehaviour<R, M>,
    /** The actor's typed `receive` behind the protocol's decoding. */
    private readonly onPeer: ((message: BusMessage) => Effect.Effect<void, never, R> | void) | undefined
  ) {}
  get ended() {
    return this.ending ? Effect.void : Deferred.await(this.done ??= Deferred.unsafeMake<void>(FiberId.none))
  }
  state() {
    return this.host.encodeState(this.actor.onHandoff?.())
  }
  expectMarker(token: string, reached: () => void) {
    this.marker = [token, reached]
  }
  disown() {
    this.owned = false
  }
  /** Waits for what the replica handing it over forwards; `forwarded` hands that over. */
  awaitForward(take: (messages: ReadonlyArray<BusMessage>) => void) {
    this.forward = take
  }
  forwarded(messages: ReadonlyArray<BusMessage>) {
    const take = this.forward
    this.forward = undefined
    take?.(messages)
  }
  /** Handles the mailbox from here on (with what arrived before); the actor ends through `end` now. */
  begin() {
    this.forward = undefined
    this.running = true
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
    this.host.runFork(this.close(why), annotated(this.host.service, this.conn))
  }
  private close(why: readonly [number, string] | "handed-over") {
    const { actor, conn, host } = this
    return Effect.suspend(() => {
      // Stopped here and not in `end`: `end` may run inside the mailbox's own drain.
      this.mailbox.stop()
      // Handed over: the adopter owns the connection, its record and its session now.
      if (why === "handed-over") return Effect.void
      return Effect.zipRight(actor.onClosed === undefined ? Effect.void : actor.onClosed(...why), host.removeRecord(conn))
    }).pipe(
      Effect.onExit((exit) => Scope.close(this.scope, exit)),
      Effect.ensuring(Effect.sync(() => host.actors.forget(conn, this.mailbox))),
      Effect.catchAllCause((cause) => Effect.logError("actor failed", cause))
    )
  }
  /** This replica stops and could not hand it over: it ends interrupted, without `onClosed`; its state stays in KV. */
  stop(interruptor: FiberId.FiberId) {
    return Effect.zipRight(Scope.close(this.scope, Exit.interrupt(interruptor)), Effect.sync(() => this.host.actors.forget(this.conn, this.mailbox)))
  }
}

/** What `HostedActors` needs of a record; `HostedActor` is one, and a unit test may stand in. */
export interface HostedRecord<R> {
  readonly conn: Subjects.ConnId
  readonly edge: Subjects.EdgeId
  readonly open: Edge.OpenEvent
  readonly http: boolean
  readonly mailbox: Mailbox<R>
  readonly owned: boolean
  readonly running: boolean
}

/** The records of one host's connections, by connection id: the only map the host keeps of them. */
export class HostedActors<R, M, A extends HostedRecord<R> = HostedActor<R, M>> {
  private readonly byConn = new Map<Subjects.ConnId, A>()
  add(actor: A) {
    this.byConn.set(actor.conn, actor)
  }
  get(conn: Subjects.ConnId): A | undefined {
    return this.byConn.get(conn)
  }
  /** Whether this replica hosts the connection now (it was not handed to another). */
  owns(conn: Subjects.ConnId) {
    return this.byConn.get(conn)?.owned === true
  }
  /** The mailbox a local peer writes into, for a connection this replica owns. */
  local(conn: Subjects.ConnId): Mailbox<R> | undefined {
    const actor = this.byConn.get(conn)
    return actor?.owned === true ? actor.mailbox : undefined
  }
  /** The actors this replica owns, as a stopping replica hands them over. */
  owned(): Array<A> {
    return [...this.byConn.values()].filter((a) => a.owned)
  }
  /** The actors whose mailbox runs, as a stopping replica ends those it kept. */
  running(): Array<A> {
    return [...this.byConn.values()].filter((a) => a.running)
  }
  /**
   * Socket connections by edge, so that a dead edge's connections end together; a Streamable HTTP
   * session outlives any edge and is left out. Built when asked (every edge check, seconds apart)
   * rather than kept as a second map that forgetting would have to clear too.
   */
  socketsByEdge(): ReadonlyMap<Subjects.EdgeId, ReadonlyArray<Mailbox<R>>> {
    const byEdge = new Map<Subjects.EdgeId, Array<Mailbox<R>>>()
    for (const actor of this.byConn.values()) {
      if (actor.http) continue
      const sockets = byEdge.get(actor.edge)
      if (sockets === undefined) byEdge.set(actor.edge, [actor.mailbox])
      else sockets.push(actor.mailbox)
    }
    return byEdge
  }
  /** Forgets a connection and stops its mailbox; harmless when done twice. */
  forget(conn: Subjects.ConnId, mailbox: Mailbox<R>) {
    mailbox.stop()
    this.byConn.delete(conn)
  }
  get size() {
    return this.byConn.size
  }
  /** How each connection was opened, as the metrics count actors by kind when scraped. */
  *opens(): IterableIterator<Edge.OpenEvent> {
    for (const actor of this.byConn.values()) yield actor.open
  }
}
