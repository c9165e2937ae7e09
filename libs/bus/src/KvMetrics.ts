/**
 * KV operations timed for metrics (`switchboard_kv_op_seconds`, `switchboard_kv_errors_total`):
 * a decorator over any `KvShape`, so an adapter stays about storage. A compare-and-set conflict is
 * an answer, not an error; an interrupted operation is not counted at all.
 */
import * as Instruments from "@switchboard/telemetry/Instruments"
import type { Registry } from "@switchboard/telemetry/Metrics"
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import { KvConflict, type KvBucketShape, type KvShape } from "./Kv.ts"

export const metered = (kv: KvShape, registry: Registry): KvShape => {
  const meter = Instruments.kv(registry)
  const ops = {
    get: meter.op("get"),
    put: meter.op("put"),
    create: meter.op("create"),
    update: meter.op("update"),
    delete: meter.op("delete"),
    keys: meter.op("keys"),
    count: meter.op("count"),
    open: meter.op("open")
  }
  const timed = <A, E>(op: keyof typeof ops, effect: Effect.Effect<A, E>): Effect.Effect<A, E> =>
    Effect.suspend(() => {
      const t0 = performance.now()
      return Effect.onExit(effect, (exit) =>
        Effect.sync(() => {
          if (Exit.isFailure(exit) && Cause.isInterruptedOnly(exit.cause)) return
          const outcome = Exit.isSuccess(exit) ? "ok" : Option.exists(Cause.failureOption(exit.cause), (e) => e instanceof KvConflict) ? "conflict" : "error"
          ops[op](outcome, (performance.now() - t0) / 1000)
        }))
    })
  const bucket = (b: KvBucketShape): KvBucketShape => ({
    name: b.name,
    get: (key) => timed("get", b.get(key)),
    put: (key, value) => timed("put", b.put(key, value)),
    create: (key, value) => timed("create", b.create(key, value)),
    update: (key, value, revision) => timed("update", b.update(key, value, revision)),
    delete: (key) => timed("delete", b.delete(key)),
    compareAndDelete: (key, revision) => timed("delete", b.compareAndDelete(key, revision)),
    keys: (filter) => timed("keys", b.keys(filter)),
    count: (filter) => timed("count", b.count(filter)),
    // A watch is a stream that lasts as long as its reader: it has no latency to report.
    watch: b.watch,
    follow: b.follow
  })
  return { bucket: (spec) => Effect.map(timed("open", kv.bucket(spec)), bucket) }
}
