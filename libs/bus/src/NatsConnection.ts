/**
 * The NATS connection the adapters share: connected with endless reconnects, its status changes
 * logged and told to reconnect listeners, one JetStream manager made when first needed, and drained
 * when its scope closes. The Bus, Kv and Journal adapters only use what this hands them.
 */
import { type JetStreamManager, jetstreamManager } from "@nats-io/jetstream"
import { connect, type NatsConnection } from "@nats-io/transport-node"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import * as Stream from "effect/Stream"
import type { BusError, BusShape } from "./Bus.ts"
import { installPooledEncoder } from "./internal/NatsShims.ts"
import { busError } from "./NatsFailures.ts"

// Process-wide, for every connection made here: nats.js's protocol lines from Node's pooled slab.
installPooledEncoder()

export interface NatsOptions {
  /** One or more server URLs. */
  readonly servers: ReadonlyArray<string>
  /** Subject and bucket namespace; `sb` by default. */
  readonly namespace?: string
  /** Client name shown by the server's monitoring. */
  readonly name?: string
  /**
   * Replicas of every KV bucket and journal stream: 1 on a single server, 3 on a three-node
   * cluster so that losing a node loses no state. An existing one with fewer is scaled up.
   */
  readonly replicas?: number
  /**
   * How long opening a bucket or journal waits for JetStream (not enabled yet on a server that
   * is starting, no meta leader during an election) before the start fails; 60 s by default.
   */
  readonly jetStreamWait?: Duration.DurationInput
  /** How long a KV write is tried again while JetStream is briefly unavailable; 10 s by default (an election takes up to 8 s). */
  readonly kvWriteRetry?: Duration.DurationInput
}

/** What the adapters get of a connection. */
export interface NatsLink {
  readonly nc: NatsConnection
  /** Every subject and bucket is put under it. */
  readonly namespace: string
  /** The connection's one JetStream manager, shared by KV and journals. */
  readonly jsm: () => Promise<JetStreamManager>
  readonly onReconnect: BusShape["onReconnect"]
  readonly isConnected: () => boolean
  /** Drains the connection (what its scope's end does too); nothing once it is closed. */
  readonly drain: Effect.Effect<void>
}

const drain = (nc: NatsConnection) => Effect.promise(() => (nc.isClosed() ? Promise.resolve() : nc.drain().catch(() => undefined)))

/** The connection alone, drained when the scope closes. */
export const connection = (options: NatsOptions) =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () =>
        connect({
          servers: [...options.servers],
          name: options.name ?? "switchboard",
          maxReconnectAttempts: -1,
          reconnectTimeWait: 250,
          pingInterval: 10_000,
          // Otherwise nats.js makes two errors per request up front (a RequestError and a
          // TimeoutError, each with its stack) for a trace of where it was asked: about 0.5 KB of
          // every handshake's requests, kept until the answer and so promoted (issue 29). The
          // adapters map every failure to a typed error of their own, which never shows that trace.
          noAsyncTraces: true
        }),
      catch: busError("Connect", `cannot connect to NATS at ${options.servers.join(",")}`)
    }),
    drain
  )

/**
 * One JetStream manager per connection, made when first needed and shared by KV and journals. One
 * that could not be made (JetStream not enabled yet) is made again next time, not kept failed.
 */
export const lazyManager = (nc: NatsConnection) => {
  let manager: Promise<JetStreamManager> | undefined
  return () =>
    (manager ??= jetstreamManager(nc).catch((e: unknown) => {
      manager = undefined
      throw e
    }))
}

/** Listeners told of each reconnect, each for as long as its scope is open. */
export const reconnects = (nc: NatsConnection): BusShape["onReconnect"] => {
  const listeners = new Set<() => void>()
  // A plain loop rather than a fiber: interrupting a fiber parked in the status iterator would wait
  // for its next event. It ends when the connection closes.
  void (async () => {
    for await (const s of nc.status()) {
      if (s.type === "reconnect") for (const listener of listeners) listener()
    }
  })().catch(() => undefined)
  return (listener) =>
    Effect.acquireRelease(Effect.sync(() => void listeners.add(listener)), () => Effect.sync(() => void listeners.delete(listener)))
}

/** Connects, logs the connection's troubles as they come, and hands the adapters their link. */
export const link = (options: NatsOptions): Effect.Effect<NatsLink, BusError, Scope.Scope> =>
  Effect.gen(function*() {
    const nc = yield* connection(options)
    const namespace = options.namespace ?? "sb"
    yield* Stream.fromAsyncIterable(nc.status(), () => undefined).pipe(
      Stream.filter((s) => s.type === "disconnect" || s.type === "reconnect" || s.type === "error"),
      Stream.runForEach((s) => Effect.logWarning(`NATS ${s.type}`)),
      Effect.ignore,
      // Interrupting a fiber parked in the status iterator waits for its next event (up to a ping
      // interval), so this one is left to end by itself when the connection closes.
      Effect.forkDaemon
    )
    yield* Effect.logInfo(`connected to NATS at ${nc.getServer()} (namespace ${namespace})`)
    return {
      nc,
      namespace,
      jsm: lazyManager(nc),
      onReconnect: reconnects(nc),
      isConnected: () => !nc.isClosed() && !nc.isDraining(),
      drain: drain(nc)
    }
  })
