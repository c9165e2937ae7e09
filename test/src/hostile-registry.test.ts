/**
 * The registry under hostile input (issue 12, "Hardening first"), grouped by attack: each test
 * sends what an attacker's tab or MCP client would, and checks that the sender gets an answer, the
 * socket and the rest of the service carry on, and what it costs (log, memory, listing) stays
 * bounded. registry.test.ts covers the ordinary bad input.
 */
import { describe, expect, it } from "@effect/vitest"
import { InMemorySpanExporter } from "@opentelemetry/sdk-trace-base"
import { Actors, Bus, Kv, Subjects } from "@switchboard/bus"
import { Edge } from "@switchboard/edge"
import type { Registry as RegistryProtocol } from "@switchboard/protocol"
import { Registry } from "@switchboard/registry"
import { Router } from "@switchboard/router"
import { Telemetry } from "@switchboard/telemetry"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import * as Option from "effect/Option"
import { closedWith, type TestClient } from "./support/Client.ts"
import { busLayer, stack } from "./support/Stack.ts"
import { hub, rawHub, rawTab, tabFrames, toolsUntil } from "./support/Tabs.ts"
import { until } from "./support/Until.ts"

const { hello, register, tool } = tabFrames

/**
 * Log lines at WARN and above, as the default logger would print them: the registry's, and those of
 * the layers built after it (the edge's, which has nothing to warn about with an Origin allow-list).
 */
const captureLogs = () => {
  const all: Array<string> = []
  const logger = Logger.map(Logger.stringLogger, (line) => void all.push(line))
  const layer = Layer.provide(Logger.replace(Logger.defaultLogger, logger), Logger.minimumLogLevel(LogLevel.Warning))
  const lines = () => [...all]
  const warnings = () => all.filter((l) => l.includes("level=WARN"))
  /**
   * The warnings about a tab's tools. A logger a layer installs reaches the layers built after it,
   * the edge's among them: on a clone where the /embed script is not built, the edge's warning
   * about that lands here too.
   */
  const toolWarnings = () => warnings().filter((l) => l.includes("tool"))
  return { lines, warnings, toolWarnings, bytes: () => all.reduce((n, l) => n + Buffer.byteLength(l), 0), layer }
}
type Logs = ReturnType<typeof captureLogs>

/** The stack with the registry's logs going to `logs` (the stack itself logs errors only). */
const build = (env: Record<string, string> = {}, logs: Logs = captureLogs(), tracing?: Layer.Layer<Telemetry.Tracing>) =>
  Layer.build(
    stack(busLayer(), {
      services: Layer.mergeAll(Router.layer, Registry.layer.pipe(Layer.provide(logs.layer))),
      env: { ALLOWED_ORIGINS: "https://app.example.com", ...env },
      ...(tracing === undefined ? {} : { tracing })
    })
  )
const wsOf = (ctx: Context.Context<Edge.EdgeServer>) => Context.get(ctx, Edge.EdgeServer).url.replace("http", "ws")

/** The next answer to a request, past any notifications (`list_changed`) sent before it. */
const answerOn = (c: TestClient) =>
  Effect.gen(function*() {
    for (;;) {
      const m = yield* c.next
      if (typeof m === "object" && m !== null && "id" in m) return m
    }
  })

/** A JSON value nested `depth` objects deep, as text (building it as a value would be the attack). */
const nested = (depth: number) => `${'{"a":'.repeat(depth)}1${"}".repeat(depth)}`

interface RegisterAnswer {
  readonly id: string
  readonly result: {
    readonly registered: number
    readonly rejected: ReadonlyArray<string>
    readonly rejectedCount?: number
    readonly rejectedByKind?: Record<string, number>
  }
}

describe("hostile registry input: deeply nested JSON", () => {
  it.scopedLive("a /tabs registerTools nested 6,000 deep is answered -32700 at once; the socket stays and registers afterwards", () =>
    Effect.gen(function*() {
      const ctx = yield* build()
      const ws = wsOf(ctx)
      const t = yield* rawTab(ws, "alice")
      t.send(hello(1, "https://deep.example.com/", { id: "hi" }))
      expect(yield* t.next).toMatchObject({ id: "hi", result: { domain: "deep.example.com" } })
      t.send(`{"jsonrpc":"2.0","id":"deep","method":"browser/registerTools","params":{"tools":[${nested(6_000)}]}}`)
      expect(yield* t.next).toMatchObject({ id: null, error: { code: -32700, message: expect.stringContaining("nested deeper") } })
      t.send(register([tool("fine")], "after"))
      expect(yield* t.next).toMatchObject({ id: "after", result: { registered: 1, rejected: [] } })
      const { client } = yield* hub(ws, "alice")
      yield* toolsUntil(client, (n) => n.includes("website_tool_deep_example_com_tab1_fine"))
    }))

  it.scopedLive("a /hub tools/call whose arguments nest 6,000 deep is answered -32700 at once", () =>
    Effect.gen(function*() {
      const ws = wsOf(yield* build())
      const other = yield* rawHub(ws, "alice")
      const c = yield* rawHub(ws, "alice")
      c.send(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":${nested(6_000)}}}`)
      expect(yield* c.next).toMatchObject({ id: null, error: { code: -32700, message: expect.stringContaining("nested deeper") } })
      // The MCP WebSocket transport ends a session that sent an invalid frame; nobody else notices.
      expect((yield* closedWith(c)).code).toBe(1002)
      other.send({ jsonrpc: "2.0", id: 2, method: "ping" })
      expect(yield* other.next).toEqual({ jsonrpc: "2.0", id: 2, result: {} })
    }))

  it.scopedLive("a malformed from-tab message on the bus is logged and dropped; the hub session carries on", () =>
    Effect.gen(function*() {
      const logs = captureLogs()
      const ctx = yield* build({}, logs)
      const ws = wsOf(ctx)
      const c = yield* rawHub(ws, "alice")
      const connections = Kv.typed(yield* Context.get(ctx, Kv.Kv).bucket(Subjects.Bucket.connections), Actors.ConnectionRecord)
      const hubs: Array<string> = []
      for (const key of yield* connections.keys()) {
        const found = yield* connections.get(key)
        if (Option.isSome(found) && found.value.value.open.path === "/hub") hubs.push(key)
      }
      expect(hubs).toHaveLength(1)
      const bus = Context.get(ctx, Bus.Bus)
      // As a tab actor tells it (`Registry.FromTab`), with bodies no tab actor would send.
      const headers = { [Subjects.Header.op]: "peer", [Subjects.Header.kind]: "FromTab" satisfies RegistryProtocol.FromTab["_tag"] }
      for (const body of ["{not json", "null", `{"tab":"x","message":5}`, `{"tab":"x","message":${nested(6_000)}}`]) {
        yield* bus.publish(Subjects.conn("registry", Subjects.ConnId(hubs[0]!)), body, headers)
      }
      yield* until(() => logs.warnings().filter((l) => l.includes("malformed")).length === 4, "four warnings about malformed messages")
      expect(logs.lines().filter((l) => l.includes("level=ERROR"))).toEqual([])
      c.send({ jsonrpc: "2.0", id: 1, method: "tools/list" })
      expect(yield* c.next).toEqual({ jsonrpc: "2.0", id: 1, result: { tools: [] } })
    }))
})

describe("hostile registry input: log amplification", () => {
  it.scopedLive("10,000 tools in one frame: the tab's answer says what was rejected in a few KB, and the log gets one short warning", () =>
    Effect.gen(function*() {
      const logs = captureLogs()
      const ws = wsOf(yield* build({}, logs))
      const t = yield* rawTab(ws, "alice")
      t.send(hello(1, "https://flood.example.com/"))
      const frame = JSON.stringify(register(Array.from({ length: 10_000 }, (_, i) => tool(`tool_${String(i).padStart(5, "0")}`)), "flood"))
      expect(frame.length).toBeGreaterThan(400_000)
      t.send(frame)
      const text = yield* t.nextText
      const answer = JSON.parse(text) as RegisterAnswer
      expect(answer.result).toMatchObject({ registered: 256, rejectedCount: 9_744, rejectedByKind: { "over-limit": 9_744 } })
      expect(answer.result.rejected.length).toBeLessThanOrEqual(20)
      expect(answer.result.rejected[0]).toContain("over the limit of 256 tools per tab")
      expect(text.length).toBeLessThan(4_096)
      expect(logs.toolWarnings()).toHaveLength(1)
      expect(logs.toolWarnings()[0]).toContain("rejected 9744 tool(s) (over-limit: 9744)")
      expect(logs.toolWarnings().reduce((n, l) => n + Buffer.byteLength(l), 0)).toBeLessThan(2_048)
    }))

  it.scopedLive("the same bad frame in a loop is answered every time, but warned about once per interval per socket", () =>
    Effect.gen(function*() {
      const logs = captureLogs()
      const ws = wsOf(yield* build({}, logs))
      const t = yield* rawTab(ws, "alice")
      t.send(hello(1, "https://loop.example.com/"))
      const bad = [tool("ok"), { name: "" }, tool("ok")]
      for (let i = 0; i < 50; i++) {
        t.send(register(bad, i))
        // A notification has no one to answer: it can only be logged.
        t.send({ jsonrpc: "2.0", method: "browser/registerTools", params: { tools: "not a list" } })
      }
      for (let i = 0; i < 50; i++) expect(yield* t.next).toMatchObject({ id: i, result: { registered: 1, rejectedCount: 2 } })
      expect(logs.toolWarnings()).toHaveLength(1)
      // Another socket has its own allowance.
      const other = yield* rawTab(ws, "alice")
      other.send(hello(2, "https://loop.example.com/"))
      other.send(register(bad, "other"))
      expect(yield* other.next).toMatchObject({ id: "other", result: { registered: 1 } })
      expect(logs.toolWarnings()).toHaveLength(2)
    }))
})

describe("hostile registry input: tools/list that cannot be delivered", () => {
  it.scopedLive("a tool over REGISTRY_MAX_TOOL_BYTES is rejected with the reason; the rest of the list registers", () =>
    Effect.gen(function*() {
      const ws = wsOf(yield* build())
      const t = yield* rawTab(ws, "alice")
      t.send(hello(1, "https://big.example.com/"))
      t.send(register([tool("huge", { description: "x".repeat(300_000) }), tool("small")], "r"))
      const answer = (yield* t.next) as RegisterAnswer
      expect(answer.result).toMatchObject({ registered: 1, rejectedCount: 1, rejectedByKind: { "too-large": 1 } })
      expect(answer.result.rejected).toEqual([expect.stringMatching(/^tool "huge": 3000\d\d bytes of JSON, over the limit of 65536 bytes per tool$/)])
      const { client } = yield* hub(ws, "alice")
      yield* toolsUntil(client, (n) => n.length === 1 && n[0] === "website_tool_big_example_com_tab1_small")
    }))

  it.scopedLive("large tools list over several pages, none over REGISTRY_PAGE_BYTES, and every tool arrives", () =>
    Effect.gen(function*() {
      // 60 tools of 50 KB are 3 MB: one page of them is over this outbound limit, as 100 tools of
      // 300 KB were over the default 8 MiB.
      const ws = wsOf(yield* build({ EDGE_OUTBOUND_HWM: String(2 * 1024 * 1024) }))
      const expected: Array<string> = []
      for (let tabId = 1; tabId <= 4; tabId++) {
        const t = yield* rawTab(ws, "alice")
        t.send(hello(tabId, "https://large.example.com/"))
        const tools = Array.from({ length: 15 }, (_, i) => tool(`t${i}`, { description: `${i}`.padEnd(50_000, ".") }))
        t.send(register(tools, "r"))
        expect(yield* t.next).toMatchObject({ id: "r", result: { registered: 15 } })
        expected.push(...tools.map((x) => `website_tool_large_example_com_tab${tabId}_${x.name}`))
      }
      const { client } = yield* hub(ws, "alice")
      const names: Array<string> = []
      const sizes: Array<number> = []
      let cursor: string | undefined
      for (;;) {
        const page: { tools: Array<{ name: string }>; nextCursor?: string | undefined } = yield* Effect.promise(() => client.listTools(cursor === undefined ? {} : { cursor }))
        names.push(...page.tools.map((x) => x.name))
        sizes.push(Buffer.byteLength(JSON.stringify(page.tools)))
        if (page.nextCursor === undefined) break
        cursor = page.nextCursor
      }
      expect(names.sort()).toEqual(expected.sort())
      expect(sizes.length).toBeGreaterThan(4)
      for (const size of sizes) expect(size).toBeLessThanOrEqual(512 * 1024)
    }))

  it.scopedLive("a page of one tool larger than REGISTRY_PAGE_BYTES still lists it", () =>
    Effect.gen(function*() {
      const ws = wsOf(yield* build({ REGISTRY_PAGE_BYTES: "1000" }))
      const t = yield* rawTab(ws, "alice")
      t.send(hello(1, "https://one.example.com/"))
      t.send(register([tool("a", { description: "a".repeat(5_000) }), tool("b", { description: "b".repeat(5_000) })], "r"))
      expect(yield* t.next).toMatchObject({ result: { registered: 2 } })
      const c = yield* rawHub(ws, "alice")
      c.send({ jsonrpc: "2.0", id: 1, method: "tools/list" })
      expect(yield* c.next).toMatchObject({ id: 1, result: { tools: [{ name: "website_tool_one_example_com_tab1_a" }], nextCursor: "1" } })
      c.send({ jsonrpc: "2.0", id: 2, method: "tools/list", params: { cursor: "1" } })
      const last = (yield* c.next) as { result: Record<string, unknown> }
      expect(last.result).toMatchObject({ tools: [{ name: "website_tool_one_example_com_tab1_b" }] })
      expect(last.result).not.toHaveProperty("nextCursor")
    }))
})

describe("hostile registry input: frames built to make the hub throw or grow", () => {
  it.scopedLive("with tracing on, a tools/call whose name cannot be made a string is answered -32602", () =>
    Effect.gen(function*() {
      const ws = wsOf(yield* build({}, captureLogs(), Telemetry.layerMemory("switchboard", new InMemorySpanExporter())))
      const c = yield* rawHub(ws, "alice")
      // String() on this throws ("Cannot convert object to primitive value"), and the span's name
      // attribute was built with it.
      c.send({ jsonrpc: "2.0", id: 1, method: "tools/call", params: { name: { toString: 1 } } })
      expect(yield* answerOn(c)).toMatchObject({ id: 1, error: { code: -32602 } })
    }))

  it.scopedLive("a huge page title is cut before it is copied into every tool's description; an absurd host name is refused", () =>
    Effect.gen(function*() {
      const ws = wsOf(yield* build())
      const t = yield* rawTab(ws, "alice")
      t.send(hello(1, "https://title.example.com/", { title: "T".repeat(100_000) }))
      t.send(register([tool("a"), tool("b")], "r"))
      expect(yield* t.next).toMatchObject({ id: "r", result: { registered: 2 } })
      const { client } = yield* hub(ws, "alice")
      const tools = yield* toolsUntil(client, (n) => n.length === 2)
      for (const x of tools) expect(x.description?.length).toBeLessThan(400)
      const absurd = yield* rawTab(ws, "alice")
      absurd.send(hello(2, `https://${"a".repeat(60)}.${"b".repeat(60)}.${"c".repeat(60)}.${"d".repeat(60)}.${"e".repeat(60)}.example/`))
      expect(yield* closedWith(absurd)).toMatchObject({ code: 1002, reason: expect.stringContaining("host name") })
    }))
})
