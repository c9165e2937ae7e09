/** Closed-loop throughput of one running target at every load shape, with its processes' CPU and RSS. */
import * as Effect from "effect/Effect"
import { type LoadOptions, run, type Shape } from "./load.ts"
import { costs, type Groups, type Measured, profileWindow, sample, type Started, type Usage } from "./processes.ts"
import type { ThroughputLine } from "./report.ts"

export const SECONDS = Number(process.env["BENCH_SECONDS"] ?? 3)
const WARMUP = 0.5
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

/** Every shape against one running target; CPU is sampled over exactly the measured window. */
export const measure = (suite: string, target: Target) =>
  Effect.forEach(shapes, ([shape, load]) =>
    Effect.gen(function*() {
      const groups: Groups = [
        ["server", target.server],
        ...Object.entries(target.apart ?? {}).flatMap(([key, p]) => (p === undefined ? [] : [[key, [p]] as const]))
      ]
      let opened: ReadonlyArray<Usage> = []
      let closed: ReadonlyArray<Usage> = []
      let endProfileWindow = profileWindow()
      const r = yield* Effect.tryPromise(() =>
        run({
          ...target.load,
          shape: load,
          seconds: SECONDS,
          warmupSeconds: WARMUP,
          onWindow: (edge) => {
            if (edge === "open") {
              opened = sample(groups)
              endProfileWindow = profileWindow()
            } else {
              closed = sample(groups)
              endProfileWindow(`${suite} ${target.name} ${shape}`)
            }
          }
        })
      )
      const line: ThroughputLine = {
        suite,
        target: target.name,
        shape,
        msgs_per_s: r.msgsPerSec,
        p50_us: r.p50Us,
        p99_us: r.p99Us,
        ...costs(groups, opened, closed, r.count, "msg")
      }
      return line
    })
  )
