/** Closed-loop throughput of one running target at every load shape, with its processes' CPU and RSS. */
import * as Effect from "effect/Effect"
import { type LoadOptions, percentile, type Result, run, type Shape } from "./load.ts"
import { costs, type Groups, type Measured, measuredWindow, sample, type Started } from "./processes.ts"
import { print, round2, type ThroughputLine } from "./report.ts"

export const SECONDS = Number(process.env["BENCH_SECONDS"] ?? 3)
export const WARMUP = 0.5
export const shapes: ReadonlyArray<readonly [string, Shape]> = [
  ["1x1", { clients: 1, inFlight: 1 }],
  ["50x10", { clients: 50, inFlight: 10 }]
]

export interface Target {
  readonly name: string
  /** Reported as `server_*`, summed: the one process, or every edge. */
  readonly server: ReadonlyArray<Started>
  /** Reported apart as `<key>_rss_mb` and `<key>_cpu_us_per_msg`. */
  readonly apart?: Readonly<Record<string, Measured | undefined>>
  readonly load: Pick<LoadOptions, "url" | "frame" | "setup" | "isReply">
}

/**
 * Every shape through `runShape` (a closed loop that calls `onWindow` as its measured window opens
 * and closes); the processes in `groups` have their CPU sampled over exactly that window.
 */
export const measureWith = (
  suite: string,
  name: string,
  groups: Groups,
  runShape: (shape: Shape, onWindow: (edge: "open" | "close") => void) => Promise<Result>,
  over: ReadonlyArray<readonly [string, Shape]> = shapes
) =>
  Effect.forEach(over, ([shape, load]) =>
    Effect.gen(function*() {
      const window = measuredWindow(() => sample(groups), `${suite} ${name} ${shape}`)
      const r = yield* Effect.tryPromise(() => runShape(load, window.onWindow))
      const line: ThroughputLine = {
        suite,
        target: name,
        shape,
        msgs_per_s: r.msgsPerSec,
        p50_us: r.p50Us,
        p99_us: r.p99Us,
        ...costs(groups, window.opened(), window.closed(), r.count, "msg")
      }
      return line
    })
  )

/** Every shape against one running WebSocket target. */
export const measure = (suite: string, target: Target) =>
  measureWith(
    suite,
    target.name,
    [
      ["server", target.server],
      ...Object.entries(target.apart ?? {}).flatMap(([key, p]) => (p === undefined ? [] : [[key, [p]] as const]))
    ],
    (shape, onWindow) => run({ ...target.load, shape, seconds: SECONDS, warmupSeconds: WARMUP, onWindow })
  )

/** One side of a pair: a closed loop at `shape` for `seconds`, after a short warm-up of its own. */
export type Side = (shape: Shape, seconds: number) => Promise<Result>

/** A WebSocket load as a side of a pair. */
const wsSide = (load: Target["load"]): Side => (shape, seconds) => run({ ...load, shape, seconds, warmupSeconds: 0.2 })

export interface Paired {
  readonly suite: string
  readonly target: string
  /** The line's `measure`. */
  readonly measure: string
  /** The other side of each pair: the plain echo (`{ url }`), or another target; a WebSocket load, or any side. */
  readonly baseline: Target["load"] | Side
  readonly load: Target["load"] | Side
  readonly shape: Shape
  /** The pair's ratio, from the target's window and the baseline's. */
  readonly ratio: (target: Result, plain: Result) => number
}

/**
 * 21 pairs of half-second windows, not 7 of a second: on this machine a single pair's ratio of
 * 1×1 p50s ranged from 2.2 to 3.8 within one minute while the median stayed near 2.85, and the
 * spread of a median shrinks with the square root of the pairs counted. About 30 s a target.
 */
const PAIRS = 21
const PAIR_SECONDS = 0.5

/**
 * A target against a baseline (the plain echo, or a floor such as the NATS relay) in pairs of
 * windows, one of each, PAIRS times, and the median of the pairs' ratios, with its quartiles.
 * This machine's speed drifts by a third within minutes (plain echo p50s of 76 to 117 µs in one
 * afternoon, 67k to 101k msgs/s at 50×10), and a suite's lines measure the plain echo a minute
 * before the target; within a pair, both sides see the same machine.
 */
export const paired = (options: Paired) =>
  Effect.promise(async () => {
    const ratios: Array<number> = []
    const sideOf = (side: Target["load"] | Side) => (typeof side === "function" ? side : wsSide(side))
    const [runBaseline, runTarget] = [sideOf(options.baseline), sideOf(options.load)]
    const baseline = () => runBaseline(options.shape, PAIR_SECONDS)
    const target = () => runTarget(options.shape, PAIR_SECONDS)
    for (let i = 0; i < PAIRS; i++) {
      // Each side first in turn: a window's closed sockets leave work (a session's teardown, KV
      // deletes) in the processes of its side that spills into the next window, whichever it is.
      if (i % 2 === 0) {
        const b = await baseline()
        ratios.push(options.ratio(await target(), b))
      } else {
        const t = await target()
        ratios.push(options.ratio(t, await baseline()))
      }
    }
    const sorted = Float64Array.from(ratios).sort()
    print({
      suite: options.suite,
      target: options.target,
      measure: options.measure,
      pairs: PAIRS,
      median: round2(percentile(sorted, 50)),
      q1: round2(percentile(sorted, 25)),
      q3: round2(percentile(sorted, 75)),
      min: round2(sorted[0] ?? 0),
      max: round2(sorted[sorted.length - 1] ?? 0)
    })
  })
