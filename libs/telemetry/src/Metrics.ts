/**
 * A process's Prometheus metrics, in the spirit of the edge's own: hot paths bump plain numbers on
 * objects they looked up once, gauges of existing state are computed when scraped, and everything
 * is rendered as text format 0.0.4 only on scrape. One registry per process by default (the
 * all-in-one's services share it, so one endpoint shows them all); a test may provide its own.
 */
import * as Context from "effect/Context"

/** Label values in declaration order. */
type Labels = ReadonlyArray<string>

const escape = (value: string) => value.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, "\\\"")

const labelText = (names: Labels, values: Labels, extra?: string) => {
  const parts = names.map((n, i) => `${n}="${escape(values[i] ?? "")}"`)
  if (extra !== undefined) parts.push(extra)
  return parts.length === 0 ? "" : `{${parts.join(",")}}`
}

/** A number a hot path may change directly: `child.value++`. */
export interface Cell {
  value: number
}

interface Family {
  readonly name: string
  readonly type: "counter" | "gauge" | "histogram"
  readonly help: string
  readonly render: (lines: Array<string>) => void
}

/** Children by their label values, made once and then kept. */
class Cells<C> {
  readonly children = new Map<string, { readonly labels: Labels; readonly cell: C }>()
  constructor(private readonly make: () => C) {}
  of(labels: Labels): C {
    const key = labels.join("\u0000")
    let found = this.children.get(key)
    if (found === undefined) this.children.set(key, (found = { labels, cell: this.make() }))
    return found.cell
  }
}

export class Counter implements Family {
  readonly type = "counter"
  private readonly cells = new Cells<Cell>(() => ({ value: 0 }))
  constructor(readonly name: string, readonly help: string, readonly labelNames: Labels) {}
  /** The cell of one label combination; keep it rather than looking it up per event. */
  labels(...values: Labels): Cell {
    return this.cells.of(values)
  }
  render(lines: Array<string>) {
    for (const { cell, labels } of this.cells.children.values()) lines.push(`${this.name}${labelText(this.labelNames, labels)} ${cell.value}`)
  }
}

/** Label values and a reading, as a gauge's collector reports them at scrape time. */
export type Reading = readonly [Labels, number]

export class Gauge implements Family {
  readonly type = "gauge"
  private readonly cells = new Cells<Cell>(() => ({ value: 0 }))
  private readonly collectors = new Set<() => Iterable<Reading>>()
  constructor(readonly name: string, readonly help: string, readonly labelNames: Labels) {}
  labels(...values: Labels): Cell {
    return this.cells.of(values)
  }
  /**
   * Reads existing state at scrape time instead of keeping a count on the hot path. Returns the
   * function that removes it (for state that ends with a scope).
   */
  collect(collector: () => Iterable<Reading>): () => void {
    this.collectors.add(collector)
    return () => void this.collectors.delete(collector)
  }
  render(lines: Array<string>) {
    for (const { cell, labels } of this.cells.children.values()) lines.push(`${this.name}${labelText(this.labelNames, labels)} ${cell.value}`)
    for (const collector of this.collectors) {
      for (const [labels, value] of collector()) lines.push(`${this.name}${labelText(this.labelNames, labels)} ${value}`)
    }
  }
}

export class HistogramCell {
  readonly counts: Array<number>
  count = 0
  sum = 0
  constructor(private readonly buckets: ReadonlyArray<number>) {
    this.counts = new Array<number>(buckets.length).fill(0)
  }
  observe(seconds: number) {
    this.count++
    this.sum += seconds
    // Only the first bucket that holds it: cumulative counts are summed on scrape, not per event.
    for (let i = 0; i < this.buckets.length; i++) {
      if (seconds <= this.buckets[i]!) {
        this.counts[i]!++
        return
      }
    }
  }
}

/** Seconds, from a fast local call to a KV write that waits for a slow NATS cluster. */
export const LATENCY_BUCKETS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5] as const

export class Histogram implements Family {
  readonly type = "histogram"
  private readonly cells: Cells<HistogramCell>
  constructor(
    readonly name: string,
    readonly help: string,
    readonly labelNames: Labels,
    readonly buckets: ReadonlyArray<number> = LATENCY_BUCKETS
  ) {
    this.cells = new Cells(() => new HistogramCell(buckets))
  }
  labels(...values: Labels): HistogramCell {
    return this.cells.of(values)
  }
  render(lines: Array<string>) {
    for (const { cell, labels } of this.cells.children.values()) {
      let cumulative = 0
      this.buckets.forEach((le, i) => {
        cumulative += cell.counts[i]!
        lines.push(`${this.name}_bucket${labelText(this.labelNames, labels, `le="${le}"`)} ${cumulative}`)
      })
      lines.push(`${this.name}_bucket${labelText(this.labelNames, labels, `le="+Inf"`)} ${cell.count}`)
      lines.push(`${this.name}_sum${labelText(this.labelNames, labels)} ${cell.sum}`)
      lines.push(`${this.name}_count${labelText(this.labelNames, labels)} ${cell.count}`)
    }
  }
}

/**
 * Families by name. Asking twice for the same name returns the same family, so every service of
 * a process (and every actor host) adds to one `switchboard_actors`, told apart by labels.
 */
export class Registry {
  private readonly families = new Map<string, Family>()
  /** Text rendered elsewhere (the edge's own metrics), appended as it is. */
  private readonly texts = new Set<() => string>()

  private family<F extends Family>(name: string, make: () => F, kind: abstract new(...args: never) => F): F {
    const found = this.families.get(name)
    if (found === undefined) {
      const made = make()
      this.families.set(name, made)
      return made
    }
    if (!(found instanceof kind)) throw new Error(`metric ${name} is already registered as a ${found.type}`)
    return found
  }
  counter(name: string, help: string, labelNames: Labels = []): Counter {
    return this.family(name, () => new Counter(name, help, labelNames), Counter)
  }
  gauge(name: string, help: string, labelNames: Labels = []): Gauge {
    return this.family(name, () => new Gauge(name, help, labelNames), Gauge)
  }
  histogram(name: string, help: string, labelNames: Labels = [], buckets?: ReadonlyArray<number>): Histogram {
    return this.family(name, () => new Histogram(name, help, labelNames, buckets), Histogram)
  }
  /** Adds text in the exposition format that another module renders; returns its removal. */
  include(render: () => string): () => void {
    this.texts.add(render)
    return () => void this.texts.delete(render)
  }

  render(): string {
    const lines: Array<string> = []
    for (const f of this.families.values()) {
      lines.push(`# HELP ${f.name} ${f.help}`, `# TYPE ${f.name} ${f.type}`)
      f.render(lines)
    }
    let text = lines.length === 0 ? "" : `${lines.join("\n")}\n`
    for (const render of this.texts) text += render()
    return text
  }
}

/**
 * The registry a process's code reports to. A `Context.Reference`: code reads it without adding a
 * requirement, and gets the process's one registry unless a test provides another.
 */
export class Metrics extends Context.Reference<Metrics>()("@switchboard/telemetry/Metrics", {
  defaultValue: () => new Registry()
}) {}
