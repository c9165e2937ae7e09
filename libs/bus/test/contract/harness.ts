/** What each part of the adapter contract is given: a fresh namespaced bus per test, and the runner. */
import { layer } from "@effect/vitest"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Queue from "effect/Queue"
import type * as Scope from "effect/Scope"
import { Bus, type BusMessage } from "../../src/Bus.ts"
import type { Journal } from "../../src/Journal.ts"
import type { Kv } from "../../src/Kv.ts"

export type MakeLayer<R> = (namespace: string) => Layer.Layer<Bus | Kv | Journal, unknown, R>

let counter = 0
const uniqueNamespace = () => `t${process.pid}x${Date.now().toString(36)}x${counter++}`

export interface Harness<R, E> {
  /** Runs `effect` against a bus, KV and journal of its own namespace. */
  readonly withBus: <A, E2>(effect: Effect.Effect<A, E2, Bus | Kv | Journal | Scope.Scope>) => Effect.Effect<A, unknown, Scope.Scope | R>
  readonly run: ReturnType<typeof layer<R, E, true>>
}

export const harness = <R, E>(shared: Layer.Layer<R, E>, makeLayer: MakeLayer<R>): Harness<R, E> => ({
  withBus: (effect) => Effect.flatMap(Layer.build(makeLayer(uniqueNamespace())), (ctx) => Effect.provide(effect, ctx)),
  run: layer(shared, { timeout: "120 seconds", excludeTestServices: true })
})

/** Collects what a subscription receives into a queue so tests can wait for events, not time. */
export const collect = (subject: string, options?: { readonly queue?: string }) =>
  Effect.gen(function*() {
    const bus = yield* Bus
    const q = yield* Queue.unbounded<BusMessage>()
    yield* bus.subscribe(subject, (m) => void Queue.unsafeOffer(q, m), options)
    return q
  })

export const takeN = (q: Queue.Queue<BusMessage>, n: number) =>
  Effect.forEach(Array.from({ length: n }), () => Queue.take(q)).pipe(
    Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error(`timed out waiting for ${n} messages`) })
  )
