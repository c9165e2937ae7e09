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

/** Prints the lines, each with its throughput as a ratio to every baseline target's at the same shape. */
export const report = (lines: ReadonlyArray<ThroughputLine>, baselines: Readonly<Record<string, string>>) => {
  for (const line of lines) {
    const ratios = Object.entries(baselines).map(([field, target]) => {
      const base = lines.find((l) => l.target === target && l.shape === line.shape)
      return [field, base === undefined || base.msgs_per_s === 0 ? null : round2(line.msgs_per_s / base.msgs_per_s)] as const
    })
    print({ ...line, ...Object.fromEntries(ratios) })
  }
}
