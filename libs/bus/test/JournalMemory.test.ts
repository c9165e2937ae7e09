/**
 * What the embedded journal holds after a forced collection, against its byte budget: the history
 * of every MCPx topic lives in it for hours, so whatever it still references once an entry is
 * dropped is memory no limit bounds. Measured as heap plus ArrayBuffers, since entries' bytes live
 * outside the heap.
 */
import { describe, expect, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import v8 from "node:v8"
import vm from "node:vm"
import type { JournalLog, JournalSpec } from "../src/Journal.ts"
import * as MemoryJournal from "../src/MemoryJournal.ts"

v8.setFlagsFromString("--expose-gc")
// The flag exposes `gc` only to contexts created after it is set, hence a new one.
const gc = vm.runInNewContext("gc") as () => void

const MiB = 1024 * 1024

/** Heap used plus ArrayBuffers, the least of a few readings each after full collections. */
const held = Effect.promise(async () => {
  let least = Number.POSITIVE_INFINITY
  for (let i = 0; i < 4; i++) {
    gc()
    await new Promise((resolve) => setImmediate(resolve))
    gc()
    const { arrayBuffers, heapUsed } = process.memoryUsage()
    least = Math.min(least, heapUsed + arrayBuffers)
  }
  return least
})

const spec = (name: string, limits: Partial<JournalSpec>): JournalSpec => ({
  name,
  maxMessagesPerKey: 1_000,
  maxAge: "1 hour",
  maxBytes: 8 * MiB,
  retryFor: "30 seconds",
  ...limits
})

/** What opening `spec`, then `fill`, costs after a forced collection, with the journal still referenced. */
const measure = (journalSpec: JournalSpec, fill: (log: JournalLog) => void) =>
  Effect.gen(function*() {
    const before = yield* held
    const log = yield* MemoryJournal.makeJournal().open(journalSpec)
    fill(log)
    const after = yield* held
    // Still in use, so the collector cannot have taken the journal itself.
    expect((yield* log.nextSeq) > 1).toBe(true)
    return after - before
  })

/** A distinct envelope of `size` bytes, as the broker appends them: bytes of its own. */
const envelope = (i: number, size: number) => {
  const bytes = new Uint8Array(size)
  bytes.fill(0x78)
  new DataView(bytes.buffer).setUint32(0, i)
  return bytes
}

const report = (what: string, bytes: number, budget: number) =>
  Effect.sync(() => console.log(`${what}: holds ${(bytes / MiB).toFixed(1)} MiB after GC for a budget of ${(budget / MiB).toFixed(1)} MiB`))

describe("embedded journal memory", () => {
  it.effect("6 topics × 300 × 60 KB into an 8 MiB budget hold about 8 MiB, not what was dropped", () =>
    Effect.gen(function*() {
      const budget = 8 * MiB
      const bytes = yield* measure(spec("big", { maxBytes: budget }), (log) => {
        for (let i = 0; i < 300; i++) for (let t = 0; t < 6; t++) log.append(`topic-${t}`, envelope(i * 6 + t, 60_000))
      })
      yield* report("60 KB entries", bytes, budget)
      expect(bytes).toBeLessThan(budget + 2 * MiB)
    }), 60_000)

  it.effect("entries a topic's count limit dropped are let go while an old entry of another topic is kept", () =>
    Effect.gen(function*() {
      // The quiet topic's one entry is the oldest, within age and budget, so nothing else ages out
      // before it: the busy topic's entries go only by its count limit.
      const budget = 8 * MiB
      const bytes = yield* measure(spec("count", { maxBytes: budget, maxMessagesPerKey: 10 }), (log) => {
        log.append("quiet", envelope(0, 100))
        for (let i = 1; i <= 1_500; i++) log.append("busy", envelope(i, 60_000))
      })
      yield* report("count-dropped 60 KB entries", bytes, budget)
      // Ten entries of 60 KB are kept.
      expect(bytes).toBeLessThan(2 * MiB)
    }), 60_000)

  it.effect("small entries: 6 topics × 20,000 × 100 B into a 1 MiB budget hold about 1 MiB, their bookkeeping counted", () =>
    Effect.gen(function*() {
      const budget = 1 * MiB
      const bytes = yield* measure(spec("small", { maxBytes: budget, maxMessagesPerKey: 100_000 }), (log) => {
        for (let i = 0; i < 20_000; i++) for (let t = 0; t < 6; t++) log.append(`topic-${t}`, envelope(i * 6 + t, 100))
      })
      yield* report("100 B entries", bytes, budget)
      expect(bytes).toBeLessThan(budget + 1 * MiB)
    }), 60_000)
})
