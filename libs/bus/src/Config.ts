/**
 * Which bus a process uses: NATS when `NATS_URL` is set, the embedded one otherwise. A service
 * split into its own process needs NATS, since the embedded bus cannot cross processes.
 */
import { Settings } from "@switchboard/protocol"
import * as Config from "effect/Config"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import { type Bus, BusError } from "./Bus.ts"
import type { Journal } from "./Journal.ts"
import type { Kv } from "./Kv.ts"
import * as MemoryBus from "./MemoryBus.ts"
import * as NatsBus from "./NatsBus.ts"

export const natsUrl = Config.option(
  Config.string("NATS_URL").pipe(
    Config.withDescription("Comma-separated NATS server URLs; the embedded in-memory bus is used when unset")
  )
)
export const namespace = Config.string("SWITCHBOARD_NAMESPACE").pipe(
  Config.withDescription("Prefix of every subject and KV bucket, so deployments can share a NATS"),
  Config.withDefault("sb")
)

/**
 * `alone`: the process is one service of several (`services/<svc>/src/main.ts`), so an embedded bus
 * would be its own, reachable by no other process: worth a warning, where the all-in-one's is not.
 */
export const stateReplicas = Settings.intBetween(
  "SWITCHBOARD_STATE_REPLICAS",
  1,
  5,
  1,
  "Replicas of every KV bucket and journal on NATS: 1 for one server, 3 for a three-node cluster (an existing bucket with fewer is scaled up)"
)

export const jetStreamWait = Settings.duration(
  "NATS_JETSTREAM_WAIT",
  "60 seconds",
  "How long a process starting waits for JetStream (a NATS server starting, an election) before it exits"
)
export const kvWriteRetry = Settings.duration(
  "NATS_KV_WRITE_RETRY",
  "10 seconds",
  "How long a KV write is tried again while JetStream is briefly unavailable (a stream leader election)"
)

export const layer = (name: string, options: { readonly alone?: boolean } = {}): Layer.Layer<Bus | Kv | Journal, BusError> =>
  Layer.unwrapEffect(
    Effect.gen(function*() {
      const url = yield* natsUrl
      const ns = yield* namespace
      const replicas = yield* stateReplicas
      const waits = { jetStreamWait: yield* jetStreamWait, kvWriteRetry: yield* kvWriteRetry }
      return Option.match(url, {
        onNone: () =>
          Layer.tap(MemoryBus.layer, () =>
            options.alone === true
              ? Effect.logWarning(
                `NATS_URL is not set: ${name} runs on a private embedded bus that no other process can reach. ` +
                  "Set NATS_URL to the NATS the other services use, or run everything in one process with `npm start`."
              )
              : Effect.logInfo("using the embedded bus (set NATS_URL for NATS)")),
        onSome: (servers) =>
          NatsBus.layer({ servers: servers.split(",").map((s) => s.trim()), namespace: ns, name, replicas, ...waits }).pipe(
            Layer.mapError((e) => (e.reason === "Connect" ? new BusError({ ...e, message: `${e.message} (NATS_URL)` }) : e))
          )
      })
    }).pipe(Effect.orDie)
  )
