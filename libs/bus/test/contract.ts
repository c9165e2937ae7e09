/**
 * The behaviour every Bus/Kv adapter must have. Each adapter's test file calls `contract` with a
 * way to build a fresh, isolated (namespaced) Bus + Kv for one test.
 */
import type * as Layer from "effect/Layer"
import { busContract } from "./contract/bus.ts"
import { harness, type MakeLayer } from "./contract/harness.ts"
import { journalContract } from "./contract/journal.ts"
import { kvContract } from "./contract/kv.ts"

export type { MakeLayer }

export const contract = <R, E>(name: string, shared: Layer.Layer<R, E>, makeLayer: MakeLayer<R>) => {
  const h = harness(shared, makeLayer)
  busContract(name, h)
  kvContract(name, h)
  journalContract(name, h)
}
