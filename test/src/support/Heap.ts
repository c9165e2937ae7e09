/**
 * The test process's live heap, for leak checks: heap used after forced full collections, so
 * that what is measured is what is still referenced, not garbage that has yet to be collected.
 */
import * as Effect from "effect/Effect"
import v8 from "node:v8"
import vm from "node:vm"

v8.setFlagsFromString("--expose-gc")
// The flag exposes `gc` only to contexts created after it is set, hence a new one.
const gc = vm.runInNewContext("gc") as () => void

/**
 * A full collection now. A load that calls it at a steady pace (every N requests) makes the
 * tables that only a full collection empties (WeakMaps whose keys died, such as Effect's
 * scheduler's map of fibers) grow to the same size under any load, instead of to however many
 * dead keys piled up before the collector happened to run: a size that is no leak, yet would
 * differ between two measurements by up to a MiB.
 */
export const collect = (): void => gc()

/**
 * Heap used, in bytes: the least of several readings, each after a full collection and a turn of
 * the event loop. What runs between readings (timers, sockets, a bus's pings) only ever adds
 * garbage to a reading, so the least is the nearest to what is still referenced.
 */
export const liveHeap = Effect.promise(async () => {
  let least = Number.POSITIVE_INFINITY
  for (let i = 0; i < 4; i++) {
    gc()
    await new Promise((resolve) => setImmediate(resolve))
    gc()
    least = Math.min(least, process.memoryUsage().heapUsed)
  }
  return least
})

export const MiB = 1024 * 1024
