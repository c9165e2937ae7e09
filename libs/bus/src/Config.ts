/**
 * Which bus a process uses: NATS when `NATS_URL` is set, the embedded one otherwise. A service
 * split into its own process needs NATS, since the embedded bus cannot cross processes.
 */
import * as Config from "effect/Config"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import type { Bus, BusError } from "./Bus.ts"
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

export const layer = (name: string): Layer.Layer<Bus | Kv | Journal, BusError> =>
  Layer.unwrapEffect(
    Effect.gen(function*() {
      const url = yield* natsUrl
      const ns = yield* namespace
      return Option.match(url, {
        onNone: () => Layer.tap(MemoryBus.layer, () => Effect.logInfo("using the embedded bus (set NATS_URL for NATS)")),
        onSome: (servers) => NatsBus.layer({ servers: servers.split(",").map((s) => s.trim()), namespace: ns, name })
      })
    }).pipe(Effect.orDie)
  )
