/**
 * What one registry replica shares among its actors: its settings, its KV buckets, the link to
 * the edges, the users' views, and the session store an adopting replica reads back. Built once
 * per replica (`Registry.ts`); each session takes what it needs from it.
 */
import { AuthClient } from "@switchboard/auth"
import { Actors, ActorTimer, Bus, ConnectionLimit, Kv, Peer, Subjects } from "@switchboard/bus"
import { Edge, Registry } from "@switchboard/protocol"
import { Instruments, Metrics, Telemetry } from "@switchboard/telemetry"
import * as Effect from "effect/Effect"
import * as FiberSet from "effect/FiberSet"
import * as Option from "effect/Option"
import { randomUUID } from "node:crypto"
import * as RegistryConfig from "./Config.ts"
import * as Views from "./Views.ts"

/** What the registry's actors say to each other (`Registry.RegistryPeer`). */
export const peers = Peer.protocol(Registry.RegistryPeer)

export const make = Effect.gen(function*() {
  const kv = yield* Kv.Kv
  const auth = yield* AuthClient.AuthClient
  const bus = yield* Bus.Bus
  const link = yield* Actors.edgeLink
  const { tracer } = yield* Telemetry.Tracing
  const metrics = yield* Metrics.Metrics
  const config = {
    callTimeout: yield* RegistryConfig.callTimeout,
    retries: yield* RegistryConfig.retries,
    retryBackoff: yield* RegistryConfig.retryBackoff,
    tabWait: yield* RegistryConfig.tabWait,
    staleTabAge: yield* RegistryConfig.staleTabAge,
    authTimeout: yield* RegistryConfig.authTimeout,
    pageSize: yield* RegistryConfig.pageSize,
    pageBytes: yield* RegistryConfig.pageBytes,
    maxToolBytes: yield* RegistryConfig.maxToolBytes,
    warningInterval: yield* RegistryConfig.warningInterval,
    maxToolsPerTab: yield* RegistryConfig.maxToolsPerTab,
    maxPending: yield* RegistryConfig.maxPending,
    replicaHeartbeat: yield* RegistryConfig.replicaHeartbeat,
    shutdownGrace: yield* RegistryConfig.shutdownGrace,
    http: {
      replayEvents: yield* RegistryConfig.httpReplayEvents,
      replayAge: yield* RegistryConfig.httpReplayAge,
      idle: yield* RegistryConfig.httpSessionIdle
    },
    maxHttpSessionsPerUser: yield* RegistryConfig.maxHttpSessionsPerUser,
    statelessIdle: yield* RegistryConfig.statelessIdle,
    maxTasksPerUser: yield* RegistryConfig.maxTasksPerUser,
    taskTtl: yield* RegistryConfig.taskTtl
  }
  // Fibers an actor starts now and then (a tab to open) run here, not in a FiberSet per actor.
  const runService = yield* FiberSet.makeRuntime<never>()
  const sessions = Actors.sessionStore(Kv.typed(yield* kv.bucket(Subjects.Bucket.registrySessions), Registry.SessionRecord))
  return {
    /** This replica's id: its liveness key in the replicas bucket, and the runner a task names. */
    id: randomUUID(),
    kv,
    auth,
    bus,
    link,
    runService,
    config,
    traced: Option.isSome(tracer),
    inFlight: Instruments.requests(metrics, "registry"),
    toolCall: Instruments.toolCalls(metrics),
    // A Streamable HTTP session outlives its requests until DELETE or its idle timeout, so one user
    // could otherwise open them without end. Counted per replica, as the router counts sockets.
    httpSessions: new ConnectionLimit(config.maxHttpSessionsPerUser),
    tabs: Kv.typed(yield* kv.bucket(Subjects.Bucket.tabs), Registry.TabRecord),
    cachedTools: Kv.typed(yield* kv.bucket(Subjects.Bucket.cachedTools), Registry.CachedToolRecord),
    connections: yield* kv.bucket(Subjects.Bucket.connections),
    views: yield* Views.make,
    ...sessions,
    /** Tells the edges that hold `subscriptions/listen` streams of `user` that the user's tools may have changed. */
    toolsChanged: (user: string) => {
      try {
        bus.unsafePublish(Subjects.toolsChanged(user), "")
      } catch {
        // The bus is closing: no edge is left to tell.
      }
    },
    /** Closes the socket unless it has said who it is in time; `reason` may depend on how far it got. */
    deadline: (conn: Actors.Connection, reason: string | (() => string)) =>
      ActorTimer.after(config.authTimeout, () => conn.close(Edge.CloseCode.PolicyViolation, typeof reason === "string" ? reason : reason()))
  }
})

export type Replica = Effect.Effect.Success<typeof make>
