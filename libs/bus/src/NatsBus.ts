/**
 * The Bus, Kv and Journal ports over NATS (`@nats-io/*` v3, JetStream): this module only composes
 * the connection (NatsConnection) with the three adapters (NatsPubSub, NatsKv, NatsJournal). Every
 * subject and bucket is put under a namespace so that several deployments (or tests) can share one
 * NATS without seeing each other.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Runtime from "effect/Runtime"
import * as Instruments from "@switchboard/telemetry/Instruments"
import { Metrics } from "@switchboard/telemetry/Metrics"
import { Bus, type BusError } from "./Bus.ts"
import * as FollowerSweep from "./FollowerSweep.ts"
import { Journal } from "./Journal.ts"
import { Kv } from "./Kv.ts"
import * as KvMetrics from "./KvMetrics.ts"
import { link, type NatsOptions } from "./NatsConnection.ts"
import { makeJournal } from "./NatsJournal.ts"
import { makeKv } from "./NatsKv.ts"
import { makeBus } from "./NatsPubSub.ts"

export { connection, type NatsOptions } from "./NatsConnection.ts"
export { DEFAULT_JETSTREAM_WAIT, isJetStreamUnavailable } from "./NatsFailures.ts"
export { makeJournal } from "./NatsJournal.ts"
export { DEFAULT_KV_WRITE_RETRY, makeKv } from "./NatsKv.ts"
export { makeBus } from "./NatsPubSub.ts"

/**
 * Bus, Kv and Journal over one NATS connection, drained when the layer's scope closes; the
 * journal's follower sweep ends with it too.
 */
export const layer = (options: NatsOptions): Layer.Layer<Bus | Kv | Journal, BusError> =>
  Layer.scopedContext(
    Effect.gen(function*() {
      const nats = yield* link(options)
      const sweep = yield* FollowerSweep.make()
      const runtime = yield* Effect.runtime<never>()
      const metrics = yield* Metrics
      return Context.make(Bus, makeBus(nats)).pipe(
        Context.add(
          Kv,
          KvMetrics.metered(
            makeKv(nats, options.replicas, {
              ...(options.jetStreamWait === undefined ? {} : { jetStream: options.jetStreamWait }),
              ...(options.kvWriteRetry === undefined ? {} : { writes: options.kvWriteRetry })
            }),
            metrics
          )
        ),
        Context.add(
          Journal,
          makeJournal(
            nats,
            sweep,
            options.replicas,
            (journal, count, why) => Runtime.runFork(runtime)(Effect.logError(`journal ${journal}: ${count} append(s) lost: ${why}`)),
            Instruments.journal(metrics),
            options.jetStreamWait
          )
        )
      )
    })
  )
