/**
 * deploy/grafana/switchboard.json is a dashboard Grafana imports (a Prometheus datasource variable
 * that every panel uses) and every PromQL expression in it names metrics Switchboard exports: the
 * edge's from services/edge/src/Metrics.ts, the services' from the list they export, and `up`.
 */
import { describe, expect, it } from "@effect/vitest"
import { readFileSync } from "node:fs"
import { fileURLToPath } from "node:url"

const root = fileURLToPath(new URL("../../", import.meta.url))
const dashboard: unknown = JSON.parse(readFileSync(`${root}deploy/grafana/switchboard.json`, "utf8"))

type Obj = { readonly [key: string]: unknown }
const isObj = (value: unknown): value is Obj => typeof value === "object" && value !== null && !Array.isArray(value)
const list = (value: unknown): ReadonlyArray<Obj> => (Array.isArray(value) ? value.filter(isObj) : [])
const field = (value: unknown, key: string): unknown => (isObj(value) ? value[key] : undefined)

/** The edge's metrics as Metrics.ts renders them: each `metric("name", "type", ...)` call. */
const edgeMetrics = [...readFileSync(`${root}services/edge/src/Metrics.ts`, "utf8").matchAll(/metric\("(\w+)", "(\w+)"/g)]
  .map(([, name = "", type = ""]) => ({ name, type }))
/** The services' metrics (router, broker, registry, auth), as their metrics servers name them. */
const serviceMetrics = [
  { name: "switchboard_actors", type: "gauge" },
  { name: "switchboard_pending_requests", type: "gauge" },
  { name: "switchboard_adoptions_total", type: "counter" },
  { name: "switchboard_handoffs_total", type: "counter" },
  { name: "switchboard_kv_op_seconds", type: "histogram" },
  { name: "switchboard_journal_append_seconds", type: "histogram" },
  { name: "switchboard_sequencer_lag", type: "gauge" },
  { name: "switchboard_tool_calls_total", type: "counter" },
  { name: "switchboard_token_checks_total", type: "counter" },
  { name: "switchboard_token_check_seconds", type: "histogram" }
]
const known = new Set(
  [...edgeMetrics, ...serviceMetrics, { name: "up", type: "gauge" }].flatMap(({ name, type }) =>
    type === "histogram" ? [`${name}_bucket`, `${name}_sum`, `${name}_count`] : [name]
  )
)

const FUNCTIONS_AND_KEYWORDS = new Set([
  "sum", "max", "min", "avg", "count", "rate", "irate", "increase", "histogram_quantile", "vector", "by", "without",
  "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset", "topk", "bottomk", "abs", "clamp_min"
])

/** The metric names one PromQL expression selects. */
const metricNames = (expr: string): ReadonlyArray<string> =>
  [...expr
    .replace(/"(?:[^"\\]|\\.)*"/g, "") // label values
    .replace(/\{[^}]*\}/g, "") // label matchers
    .replace(/\[[^\]]*\]/g, "") // ranges
    .replace(/\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, "") // label lists
    .matchAll(/[A-Za-z_:][\w:]*/g)]
    .map(([name]) => name)
    .filter((name) => !FUNCTIONS_AND_KEYWORDS.has(name))

const panels = list(field(dashboard, "panels"))
const exprs = panels.flatMap((p) => list(p["targets"]).map((t) => ({ panel: String(p["title"]), expr: String(t["expr"]) })))

describe("deploy/grafana/switchboard.json", () => {
  it("reads Metrics.ts: the edge's metric names are there to check against", () => {
    expect(edgeMetrics.map((m) => m.name)).toContain("switchboard_edge_connections")
    expect(edgeMetrics.find((m) => m.name === "switchboard_edge_bus_publish_seconds")?.type).toBe("histogram")
  })

  it("is a dashboard whose panels all query the Prometheus datasource variable", () => {
    expect(field(dashboard, "title")).toBe("Switchboard")
    const variables = list(field(field(dashboard, "templating"), "list"))
    expect(variables).toContainEqual(expect.objectContaining({ type: "datasource", name: "datasource", query: "prometheus" }))
    const queried = panels.filter((p) => p["type"] !== "row")
    expect(queried.length).toBeGreaterThan(10)
    for (const p of queried) {
      expect(p["datasource"], String(p["title"])).toEqual({ type: "prometheus", uid: "${datasource}" })
      expect(list(p["targets"]).length, String(p["title"])).toBeGreaterThan(0)
    }
    // Panels must not overlap: Grafana would move them, and the layout would not be the one meant.
    const cells = new Set<string>()
    for (const p of panels) {
      const { h = 0, w = 0, x = 0, y = 0 } = (p["gridPos"] ?? {}) as { h?: number; w?: number; x?: number; y?: number }
      expect(x + w, String(p["title"])).toBeLessThanOrEqual(24)
      for (let i = x; i < x + w; i++) for (let j = y; j < y + h; j++) {
        expect(cells.has(`${i},${j}`), `${String(p["title"])} overlaps at ${i},${j}`).toBe(false)
        cells.add(`${i},${j}`)
      }
    }
  })

  it("queries only metrics Switchboard exports", () => {
    expect(exprs.length).toBeGreaterThan(15)
    const unknown = exprs.flatMap(({ expr, panel }) => metricNames(expr).filter((n) => !known.has(n)).map((n) => `${panel}: ${n}`))
    expect(unknown).toEqual([])
    // And it shows the picture asked for: connections, per-protocol activity, latency, errors, replicas.
    const used = new Set(exprs.flatMap(({ expr }) => metricNames(expr)))
    for (const name of ["switchboard_edge_connections", "switchboard_actors", "switchboard_edge_bus_publish_seconds_bucket", "switchboard_edge_closes_total", "up"]) {
      expect(used.has(name), name).toBe(true)
    }
  })

  it("catches a misspelt metric", () => {
    expect(metricNames('sum by (path) (switchboard_edge_conections{namespace=~"$namespace"})')).toEqual(["switchboard_edge_conections"])
    expect(metricNames('histogram_quantile(0.99, sum by (le) (rate(switchboard_kv_op_seconds_bucket{x="a b"}[5m])))')).toEqual(["switchboard_kv_op_seconds_bucket"])
  })
})
