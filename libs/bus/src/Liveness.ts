/**
 * Liveness of an actor host: its replica's heartbeat key, the adoption of connections whose
 * replica's key lapsed (a replica that crashed or was killed), and the end of connections whose
 * edge's key lapsed (an edge that died cannot say that its sockets closed).
 */
import { Host } from "@switchboard/protocol"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import type { BusError, BusShape } from "./Bus.ts"
import { closeSocket, edgeIdOf } from "./EdgeLink.ts"
import { replicaInbox } from "./Handoff.ts"
import type { KvBucketShape } from "./Kv.ts"
import type { ConnectionRecord, Ownership } from "./SessionStore.ts"
import * as Subjects from "./Subjects.ts"

/** Fails when survivors could adopt a replica's connections while it still runs: its key must outlive two missed beats. */
export const checkHeartbeat = (heartbeat: Duration.Duration) =>
  Duration.greaterThan(Duration.times(heartbeat, 2), Subjects.Bucket.replicas.ttl)
    ? Effect.dieMessage(`a replica heartbeat of ${Duration.format(heartbeat)} is too slow for its ${Subjects.Bucket.replicas.ttl} key lifetime`)
    : Effect.void

/**
 * Whether `replica` of `service` still runs: its actor host answers a ping on its inbox. A replica
 * whose key lapsed may still run (its heartbeat writes failed through a NATS leader election), and
 * what it holds must not be taken from it then.
 */
export const answers = (bus: BusShape, service: Subjects.ServiceName, replica: string) =>
  replicaInbox.callOn(bus, Subjects.replicaInbox(service, replica), new Host.Ping(), { timeout: "1 second" }).pipe(
    Effect.as(true),
    Effect.orElseSucceed(() => false)
  )

/** What an edge's loss does to one of its connections: its mailbox gets `edge-lost`. */
export interface EdgeLossTarget {
  readonly offer: (m: "edge-lost") => void
}

export interface LivenessOptions {
  readonly bus: BusShape
  readonly service: Subjects.ServiceName
  readonly replica: string
  readonly heartbeat: Duration.Duration
  readonly edgeCheckInterval: Duration.DurationInput
  readonly ownership: Ownership
  readonly edges: KvBucketShape
  readonly replicas: KvBucketShape
  /** Whether this replica hosts the connection now. */
  readonly owns: (conn: Subjects.ConnId) => boolean
  /**
   * This replica's socket connections by edge, so that a dead edge's connections end together; a
   * Streamable HTTP session outlives any edge and is left out.
   */
  readonly socketsByEdge: () => ReadonlyMap<Subjects.EdgeId, ReadonlyArray<EdgeLossTarget>>
  /**
   * This replica took the connection's record from a replica that is gone: start its actor,
   * restored, and give `answer` whether the actor took it.
   */
  readonly adopted: (conn: Subjects.ConnId, record: ConnectionRecord, answer: (refused: Host.OpenRefused | undefined) => Effect.Effect<void>) => void
}

/**
 * Starts this replica's heartbeat, its adoption sweep and its edge check, until the scope closes;
 * the replica's key is deleted then. Returns whether another replica of the service is alive.
 */
export const start = (options: LivenessOptions): Effect.Effect<{ readonly othersAlive: Effect.Effect<boolean> }, BusError, Scope.Scope> =>
  Effect.gen(function*() {
    const { bus, edges, heartbeat, owns, replica, replicas, service, socketsByEdge } = options
    const connections = options.ownership.bucket
    const replicaKey = Subjects.Key.replica(service, replica)
    yield* replicas.put(replicaKey, String(Date.now()))
    yield* replicas.put(replicaKey, String(Date.now())).pipe(
      Effect.catchAll((e) => Effect.logWarning("replica heartbeat failed", e)),
      Effect.repeat(Schedule.spaced(heartbeat)),
      Effect.forkScoped
    )
    yield* Effect.addFinalizer(() => replicas.delete(replicaKey).pipe(Effect.ignore))

    /**
     * No edge awaits an adopted connection's answer: a refusal closes its socket here (a Streamable
     * HTTP session has none) and drops its record, or the client would wait on a socket nobody serves.
     */
    const answer = (connId: Subjects.ConnId, record: ConnectionRecord) => (refused: Host.OpenRefused | undefined) =>
      refused === undefined ? Effect.void : Effect.all([
        Effect.logInfo(`refused the adopted connection: ${refused.code} ${refused.reason}`),
        Effect.sync(() => {
          if (record.open.transport !== "http") closeSocket(bus, edgeIdOf(record.edge), connId, refused.code, refused.reason)
        }),
        options.ownership.remove(connId)
      ], { discard: true })

    const adopt = (connId: Subjects.ConnId, found: { readonly value: ConnectionRecord; readonly revision: number }) =>
      connections.update(connId, { ...found.value, replica }, found.revision).pipe(
        // Another survivor claimed it first; it is theirs.
        Effect.flatMap(() => Effect.sync(() => options.adopted(connId, found.value, answer(connId, found.value)))),
        Effect.catchTag("KvConflict", () => Effect.void)
      )

    /** Replicas alive at the last sweep; a full scan happens at start and when one of them lapses. */
    let lastAlive: ReadonlySet<string> | undefined
    /** Replicas that lapsed but answered: looked at again next sweep, in case they are gone by then. */
    let unsure = false
    const sweep = Effect.gen(function*() {
      const alive = new Set(yield* replicas.keys(Subjects.Key.replicas(service)))
      const lapsed = lastAlive === undefined || unsure || [...lastAlive].some((r) => !alive.has(r))
      lastAlive = alive
      unsure = false
      if (!lapsed) return
      const orphans: Array<Subjects.ConnId> = []
      const answered = new Map<string, boolean>()
      for (const key of yield* connections.keys()) {
        const connId = Subjects.ConnId(key)
        if (owns(connId)) continue
        const found = yield* connections.get(key)
        if (Option.isNone(found) || found.value.value.service !== service) continue
        const holder = found.value.value.replica
        if (alive.has(Subjects.Key.replica(service, holder))) continue
        // Adopting the connections of a replica that still runs would give each two actors in one queue group.
        if (holder !== replica) {
          if (!answered.has(holder)) answered.set(holder, yield* answers(bus, service, holder))
          if (answered.get(holder) === true) continue
        }
        orphans.push(connId)
        yield* adopt(connId, found.value)
      }
      const running = [...answered].filter(([, yes]) => yes).map(([r]) => r)
      if (running.length > 0) {
        unsure = true
        yield* Effect.logWarning(`replicas ${running.join(", ")} lapsed in KV but still answer; their connections stay theirs`)
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
      for (const [edgeId, targets] of socketsByEdge()) {
        // When KV cannot be read, assume the edge is alive rather than close healthy sockets.
        const alive = yield* edges.get(Subjects.Key.edge(edgeId)).pipe(Effect.map(Option.isSome), Effect.orElseSucceed(() => true))
        if (!alive) {
          yield* Effect.logWarning(`edge ${edgeId} is gone; closing its ${targets.length} connections`)
          for (const target of targets) target.offer("edge-lost")
        }
      }
    }).pipe(Effect.repeat(Schedule.spaced(options.edgeCheckInterval)), Effect.forkScoped)

    const othersAlive = replicas.keys(Subjects.Key.replicas(service)).pipe(
      Effect.map((keys) => keys.some((k) => k !== replicaKey)),
      Effect.orElseSucceed(() => false)
    )
    return { othersAlive }
  })
