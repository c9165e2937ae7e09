/**
 * The embedded bus, KV and journal: the same ports as NATS, in one process, for `npm start` without
 * a `NATS_URL` and for logic-only tests. This module only composes the three adapters
 * (MemoryPubSub, MemoryKv, MemoryJournal).
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { Bus } from "./Bus.ts"
import { Journal } from "./Journal.ts"
import { Kv } from "./Kv.ts"
import { makeJournal } from "./MemoryJournal.ts"
import { makeKv } from "./MemoryKv.ts"
import { makeBus } from "./MemoryPubSub.ts"

export { makeJournal } from "./MemoryJournal.ts"
export { makeKv } from "./MemoryKv.ts"
export { makeBus } from "./MemoryPubSub.ts"

/** The embedded bus, KV and journal, drained when the layer's scope closes. */
export const layer: Layer.Layer<Bus | Kv | Journal> = Layer.mergeAll(
  Layer.scoped(Bus, Effect.acquireRelease(Effect.sync(makeBus), (bus) => bus.drain)),
  Layer.sync(Kv, makeKv),
  Layer.sync(Journal, makeJournal)
)
