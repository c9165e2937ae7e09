import { describe, expect, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import * as Instruments from "../src/Instruments.ts"
import { Metrics, Registry } from "../src/Metrics.ts"

describe("Metrics registry", () => {
  it("renders counters, gauges (kept and collected) and cumulative histograms in the text format", () => {
    const r = new Registry()
    const c = r.counter("t_total", "A counter", ["op"])
    c.labels("put").value += 2
    r.gauge("t_gauge", "A gauge", ["kind"]).collect(() => [[["a\"b"], 3]])
    const h = r.histogram("t_seconds", "A histogram", [], [0.1, 1])
    h.labels().observe(0.05)
    h.labels().observe(0.5)
    h.labels().observe(5)
    r.include(() => "other_metric 1\n")
    expect(r.render()).toBe(
      [
        "# HELP t_total A counter",
        "# TYPE t_total counter",
        "t_total{op=\"put\"} 2",
        "# HELP t_gauge A gauge",
        "# TYPE t_gauge gauge",
        "t_gauge{kind=\"a\\\"b\"} 3",
        "# HELP t_seconds A histogram",
        "# TYPE t_seconds histogram",
        "t_seconds_bucket{le=\"0.1\"} 1",
        "t_seconds_bucket{le=\"1\"} 2",
        "t_seconds_bucket{le=\"+Inf\"} 3",
        "t_seconds_sum 5.55",
        "t_seconds_count 3",
        "other_metric 1",
        ""
      ].join("\n")
    )
  })

  it("returns the same family for the same name, and refuses one name with two types", () => {
    const r = new Registry()
    expect(r.counter("x_total", "x")).toBe(r.counter("x_total", "x"))
    expect(() => r.gauge("x_total", "x")).toThrow(/already registered as a counter/)
  })

  it("counts a host's actors by kind when scraped, from its records, and a kind whose actors are gone at 0", () => {
    const r = new Registry()
    const host = Instruments.actorHost(r, "router")
    const hosted: Array<{ readonly path: string; readonly transport?: "http" }> = [{ path: "/mcp" }, { path: "/hub", transport: "http" }]
    const stop = host.follow(() => hosted)
    expect(r.render()).toContain("switchboard_actors{service=\"router\",kind=\"client\"} 1")
    expect(r.render()).toContain("switchboard_actors{service=\"router\",kind=\"hub-http\"} 1")
    expect(r.render()).toContain("switchboard_handoffs_total{service=\"router\"} 0")
    hosted.shift()
    expect(r.render()).toContain("switchboard_actors{service=\"router\",kind=\"client\"} 0")
    stop()
    expect(r.render()).not.toContain("switchboard_actors{")
  })

  it("reports a topic's sequencer lag until its appends are stored or lost, by topic name", () => {
    const r = new Registry()
    const journal = Instruments.journal(r)
    const name = Buffer.from("room 1").toString("base64url")
    journal.appended(name)
    journal.appended(name)
    journal.appended(name)
    expect(r.render()).toContain("switchboard_sequencer_lag{topic=\"room 1\"} 3")
    journal.stored(name, 0.002)
    journal.lost(name, 1)
    expect(r.render()).toContain("switchboard_sequencer_lag{topic=\"room 1\"} 1")
    journal.stored(name, 0.002)
    expect(r.render()).not.toContain("switchboard_sequencer_lag{")
    expect(r.render()).toContain("switchboard_journal_append_seconds_count 2")
  })

  it.effect("is one registry per process unless a test provides its own", () =>
    Effect.gen(function*() {
      const first = yield* Metrics
      expect(yield* Metrics).toBe(first)
      const own = new Registry()
      expect(yield* Effect.provideService(Metrics, own)(Metrics)).toBe(own)
    }))
})
