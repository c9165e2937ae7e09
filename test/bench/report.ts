/**
 * What the bench prints: one JSON object per line, so that runs can be compared with `jq` or a
 * spreadsheet. Throughput suites add each line's ratio to their baselines at the same shape.
 */

export type Field = string | number | boolean | null

export interface Line {
  readonly suite: string
  readonly target: string
  readonly [field: string]: Field
}

/** A closed-loop measurement: one target at one load shape. */
export interface ThroughputLine extends Line {
  readonly shape: string
  readonly msgs_per_s: number
}

export const round1 = (n: number) => Math.round(n * 10) / 10
export const round2 = (n: number) => Math.round(n * 100) / 100

export const print = (line: Line) => console.log(JSON.stringify(line))

/**
 * Prints the lines, each with its throughput as a ratio to every baseline target's at the same
 * shape, and its p50 as a ratio to every `p50Baselines` target's (a latency target reads better as
 * "within 1.25× of", the other way round from throughput).
 */
export const report = (
  lines: ReadonlyArray<ThroughputLine>,
  baselines: Readonly<Record<string, string>>,
  p50Baselines: Readonly<Record<string, string>> = {}
) => {
  const ratio = (line: ThroughputLine, target: string, field: "msgs_per_s" | "p50_us") => {
    const base = lines.find((l) => l.target === target && l.shape === line.shape)?.[field]
    const own = line[field]
    return typeof base !== "number" || typeof own !== "number" || base === 0 ? null : round2(own / base)
  }
  for (const line of lines) {
    const ratios = Object.entries(baselines).map(([field, target]) => [field, ratio(line, target, "msgs_per_s")] as const)
    const p50Ratios = Object.entries(p50Baselines).map(([field, target]) => [field, ratio(line, target, "p50_us")] as const)
    print({ ...line, ...Object.fromEntries(ratios), ...Object.fromEntries(p50Ratios) })
  }
}
