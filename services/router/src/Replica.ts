/**
 * What one router replica shares among its actors and its internal requests: settings, KV
 * buckets, the link to the edges, the session store an adopting replica reads back, and the
 * per-user seats and rate budgets. Built once per replica (`Router.ts`); each piece takes what it
 * needs from it.
 */
import { AuthClient } from "@switchboard/auth"
import { ActorResource, Actors, ActorTimer, Bus, ConnectionLimit, Kv, Peer, RateBudget, Subjects } from "@switchboard/bus"
import { Proxy } from "@switchboard/protocol"
import { Instruments, Metrics, Telemetry } from "@switchboard/telemetry"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as FiberSet from "effect/FiberSet"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Scope from "effect/Scope"
import * as RouterConfig from "./Config.ts"

/** What the router's actors, and other services through `router.internal`, say to its actors. */
export const peers = Peer.protocol(Proxy.RouterPeer)

export const make = Effect.gen(function*() {
  const bus = yield* Bus.Bus
  const kv = yield* Kv.Kv
  const auth = yield* AuthClient.AuthClient
  const { tracer } = yield* Telemetry.Tracing
  const link = yield* Actors.edgeLink
  const config = {
    requestTimeout: yield* RouterConfig.requestTimeout,
    authTimeout: yield* RouterConfig.authTimeout,
    internalTimeout: yield* RouterConfig.internalTimeout,
    statusInterval: yield* RouterConfig.statusInterval,
    maxPending: yield* RouterConfig.maxPending,
    connectionRate: yield* RouterConfig.connectionRate,
    userRate: yield* RouterConfig.userRate,
    maxClientsPerUser: yield* RouterConfig.maxClientsPerUser,
    maxExtensionsPerUser: yield* RouterConfig.maxExtensionsPerUser,
    replicaHeartbeat: yield* RouterConfig.replicaHeartbeat,
    shutdownGrace: yield* RouterConfig.shutdownGrace,
    probeTimeout: yield* RouterConfig.probeTimeout,
    probeConcurrency: yield* RouterConfig.probeConcurrency
  }
  /** Runs work that starts outside any Effect (bus callbacks, timers) until the router stops. */
  const runFork = yield* FiberSet.makeRuntime<never>()
  /** Per-user budgets are per replica: exact across replicas would cost a KV write per request. */
  const userBudgets = new Map<string, RateBudget>()
  // The edge cannot cap these users' sockets: on `/mcp` and `/extension` it learns the user only
  // in-band. Counted in memory, per replica: exact across replicas would cost a KV write per socket.
  const clientSeats = new ConnectionLimit(config.maxClientsPerUser)
  const extensionSeats = new ConnectionLimit(config.maxExtensionsPerUser)
  /**
   * How each proxy actor checks its peers, by its connection: an MCP client's actor attached to an
   * extension asks the extension's actor whether it still knows it; an extension's actor with
   * clients looks up their records. Peer messages to this replica's actors are lost while its
   * NATS connection is down (core NATS keeps nothing for a subscriber that is away), an
   * `ExtensionGone` or a `Detach` among them; so when the connection comes back, every one checks.
   */
  const probes = new Map<Subjects.ConnId, () => Effect.Effect<ProbeOutcome>>()
  let sweeping = false
  let again = false
  // Bounded concurrency, not one burst: 10,000 sessions must not ask NATS and the extensions'
  // replicas all at once, just as the connection came back.
  const sweep = Effect.suspend(() => {
    again = false
    const started = Date.now()
    const all = [...probes.values()]
    const outcomes = { attached: 0, gone: 0, unknown: 0 }
    return Effect.forEach(all, (probe) => Effect.map(probe(), (o) => void outcomes[o]++), { concurrency: config.probeConcurrency, discard: true }).pipe(
      Effect.zipRight(Effect.suspend(() =>
        all.length === 0 ? Effect.void : Effect.logInfo(
          `router: NATS connection back; checked the peers of ${all.length} proxy actors in ${Date.now() - started} ms: ` +
            `${outcomes.attached} still attached, ${outcomes.gone} gone, ${outcomes.unknown} unanswered`
        )
      ))
    )
  }).pipe(
    // Lost again while checking: what was checked before may have missed messages since.
    Effect.repeat({ while: () => again }),
    Effect.ensuring(Effect.sync(() => void (sweeping = false)))
  )
  yield* bus.onReconnect(() => {
    if (sweeping) return void (again = true)
    sweeping = true
    runFork(sweep)
  })
  // A budget outlives its user's clients by at most a minute, so users who come and go leave none.
  yield* Effect.sync(() => {
    for (const user of userBudgets.keys()) if (clientSeats.count(user) === 0) userBudgets.delete(user)
  }).pipe(Effect.repeat(Schedule.spaced("1 minute")), Effect.forkScoped)

  return {
    bus,
    auth,
    link,
    config,
    runFork,
    traced: Option.isSome(tracer),
    inFlight: Instruments.requests(yield* Metrics.Metrics, "router"),
    timeoutMillis: Duration.toMillis(config.requestTimeout),
    timedOut: `Request timed out after ${Duration.format(config.requestTimeout)}`,
    internalMillis: Duration.toMillis(config.internalTimeout),
    internalTimedOut: `Request timed out after ${Duration.format(config.internalTimeout)}`,
    extensions: Kv.typed(yield* kv.bucket(Subjects.Bucket.extensions), Proxy.ExtensionRecord),
    extensionIds: yield* kv.bucket(Subjects.Bucket.extensionIds),
    proxies: Kv.typed(yield* kv.bucket(Subjects.Bucket.proxyConnections), Proxy.ProxyConnectionRecord),
    ...Actors.sessionStore(Kv.typed(yield* kv.bucket(Subjects.Bucket.sessions), Proxy.SessionRecord)),
    clientSeats,
    extensionSeats,
    probes,
    /**
     * Enters an actor in `probes` with how it checks its peers (again, when its peers changed).
     * The first time, its scope is told to take it out: a handed-over actor ends without `onClosed`.
     */
    track: (conn: Subjects.ConnId, scope: Scope.Scope, check: () => Effect.Effect<ProbeOutcome>, first: boolean): Effect.Effect<void> => {
      probes.set(conn, check)
      return first ? ActorResource.onClose(scope, () => void probes.delete(conn)) : Effect.void
    },
    userBudget: (user: string) => {
      let b = userBudgets.get(user)
      if (!b) userBudgets.set(user, (b = new RateBudget(config.userRate, config.userRate * 2)))
      return b
    },
    /**
     * Takes one of `user`'s seats until `scope` closes; false, taking nothing, at the cap. `force`
     * takes one regardless: a socket adopted from another replica was admitted there.
     */
    seat: (seats: ConnectionLimit, user: string, scope: Scope.Scope, force = false) =>
      Effect.suspend(() => {
        const release = seats.take(user, force)
        return release === undefined ? Effect.succeed(false) : Effect.as(ActorResource.onClose(scope, release), true)
      }),
    /** The status keepalive, for as long as the connection's scope lives (a timer, not a fiber: issue 16). */
    keepalive: (scope: Scope.Scope, send: () => void) => Scope.extend(ActorTimer.every(config.statusInterval, send), scope)
  }
})

export type Replica = Effect.Effect.Success<typeof make>

/**
 * What a session's check of its extension found: still attached, gone (the session ends as on
 * `ExtensionGone`), or no answer in time (a slow NATS or a busy replica is no proof of anything).
 */
export type ProbeOutcome = "attached" | "gone" | "unknown"

/**
 * Asks `peer` whether proxy connection `connectionId` is still attached to it. Nobody listening on
 * `peer` means gone, unless `record` (read only then) still names `peer`: its replica died and a
 * survivor has yet to adopt it (within 6 s). No answer in time, or a failed read, proves nothing.
 */
export const askAttached = <A>(
  from: Peer.Sender,
  peer: Subjects.ConnId,
  connectionId: string,
  timeout: Duration.DurationInput,
  record: Effect.Effect<Option.Option<{ readonly value: A }>, unknown>,
  namesPeer: (value: A) => boolean
): Effect.Effect<ProbeOutcome> =>
  peers.ask(from, peer, new Proxy.Probe({ connectionId }), { timeout }).pipe(
    Effect.map(({ attached }): ProbeOutcome => (attached ? "attached" : "gone")),
    Effect.catchAll((why) =>
      why._tag === "PeerUnavailable" && why.reason === "NoResponders"
        ? record.pipe(
          Effect.map(Option.match({ onNone: (): ProbeOutcome => "gone", onSome: ({ value }): ProbeOutcome => (namesPeer(value) ? "unknown" : "gone") })),
          Effect.orElseSucceed((): ProbeOutcome => "unknown")
        )
        : Effect.succeed<ProbeOutcome>("unknown")
    )
  )
