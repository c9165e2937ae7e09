/**
 * Another process's resident set, from /proc: what the machine pays for it, buffers outside V8's
 * heap included, and the figure an operator's memory limit applies to. A soak reads it before and
 * after, and samples it while an attack runs for the peak.
 */
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Schedule from "effect/Schedule"
import { readFileSync } from "node:fs"

export const MiB = 1024 * 1024

/** Bytes resident for `pid` now. */
export const rssOf = (pid: number): number => {
  const m = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))
  return m?.[1] === undefined ? Number.NaN : Number(m[1]) * 1024
}

/** Samples `pid` every 50 ms until the scope closes or `stop` runs; `peak()` is the most seen so far. */
export const peakRss = (pid: number) =>
  Effect.gen(function*() {
    let peak = rssOf(pid)
    const sample = Effect.sync(() => void (peak = Math.max(peak, rssOf(pid))))
    const fiber = yield* Effect.forkScoped(Effect.repeat(sample, Schedule.spaced("50 millis")))
    return { peak: () => peak, stop: Effect.zipRight(Fiber.interrupt(fiber), sample) }
  })

/** Bytes as MiB with one decimal, for the figures a test prints. */
export const mib = (bytes: number) => Math.round((bytes / MiB) * 10) / 10
