/**
 * One `tools/call` through the hub is one trace: the client's frame at the edge, the registry
 * routing it, the edge delivering `browser/executeTool` to the tab, the registry answering, and the
 * edge delivering the answer. The tab's frames start no trace of their own. The same holds over
 * Streamable HTTP, where a host's own `traceparent` header is the trace's root.
 */
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js"
import { describe, expect, it } from "@effect/vitest"
import { InMemorySpanExporter, type ReadableSpan } from "@opentelemetry/sdk-trace-base"
import { Edge } from "@switchboard/edge"
import { Registry } from "@switchboard/registry"
import { Telemetry } from "@switchboard/telemetry"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import { modernMeta, modernPost } from "./support/Modern.ts"
import { busLayer, stack, token } from "./support/Stack.ts"
import { hub, page, tab, textOf, toolsUntil } from "./support/Tabs.ts"

const TOOL = "website_tool_shop_example_com_tab1_getCart"

class NotYet extends Error {}

const parentOf = (s: ReadableSpan) => s.parentSpanContext?.spanId
const idOf = (s: ReadableSpan) => s.spanContext().spanId

describe("registry tracing", () => {
  it.scopedLive("one tools/call is one trace, its spans in parent/child order", () =>
    Effect.gen(function*() {
      const exporter = new InMemorySpanExporter()
      const ctx = yield* Layer.build(stack(busLayer(), { services: Registry.layer, tracing: Telemetry.layerMemory("switchboard", exporter) }))
      const ws = Context.get(ctx, Edge.EdgeServer).url.replace("http", "ws")
      yield* tab(ws, page("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      const { client } = yield* hub(ws, "alice")
      yield* toolsUntil(client, (n) => n.includes(TOOL))
      expect(textOf(yield* Effect.promise(() => client.callTool({ name: TOOL, arguments: { text: "t" } })))).toBe("shop:getCart:t")

      const trace = yield* Effect.suspend(() => {
        const spans = exporter.getFinishedSpans()
        const call = spans.find((s) => s.name === "registry.call")
        const trace = call === undefined ? [] : spans.filter((s) => s.spanContext().traceId === call.spanContext().traceId)
        return trace.length >= 5 ? Effect.succeed(trace) : Effect.fail(new NotYet(spans.map((s) => s.name).join(", ")))
      }).pipe(Effect.retry(Schedule.spaced("20 millis").pipe(Schedule.upTo("5 seconds"))), Effect.orDie)

      expect(trace.map((s) => s.name).sort()).toEqual(["edge.deliver", "edge.deliver", "edge.receive", "registry.call", "registry.reply"])
      const receive = trace.find((s) => s.name === "edge.receive")!
      const call = trace.find((s) => s.name === "registry.call")!
      const reply = trace.find((s) => s.name === "registry.reply")!
      const toTab = trace.find((s) => s.name === "edge.deliver" && parentOf(s) === idOf(call))
      const toClient = trace.find((s) => s.name === "edge.deliver" && parentOf(s) === idOf(reply))
      expect(receive.attributes["sb.path"]).toBe("/hub")
      expect(parentOf(call)).toBe(idOf(receive))
      expect(parentOf(reply)).toBe(idOf(call))
      expect(toTab).toBeDefined()
      expect(toClient?.attributes["sb.conn"]).toBe(receive.attributes["sb.conn"])
      expect(call.attributes).toMatchObject({ "rpc.method": "tools/call", "mcp.tool.name": TOOL, "user_id": "alice", "mcp.tool.domain": "shop.example.com" })
      expect(call.attributes["mcp.mapped_id"]).toBe(reply.attributes["mcp.mapped_id"])
      // The tab's answer continued the call's trace rather than starting one.
      expect(exporter.getFinishedSpans().filter((s) => s.name === "edge.receive" && s.attributes["sb.path"] === "/tabs")).toEqual([])
    }))

  it.scopedLive("over Streamable HTTP too, continuing the trace of a host that sends a traceparent", () =>
    Effect.gen(function*() {
      const exporter = new InMemorySpanExporter()
      const ctx = yield* Layer.build(stack(busLayer(), { services: Registry.layer, tracing: Telemetry.layerMemory("switchboard", exporter) }))
      const base = Context.get(ctx, Edge.EdgeServer).url
      yield* tab(base.replace("http", "ws"), page("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      // The host's own span, as an instrumented host would send it with each request.
      const hostTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
      const hostSpan = "00f067aa0ba902b7"
      const t = yield* token({ sub: "alice" })
      const client = new Client({ name: "traced-host", version: "0.0.0" })
      const transport = new StreamableHTTPClientTransport(new URL(`${base}/hub`), {
        requestInit: { headers: { Authorization: `Bearer ${t}`, traceparent: `00-${hostTrace}-${hostSpan}-01` } }
      })
      yield* Effect.acquireRelease(Effect.promise(() => client.connect(transport)), () => Effect.promise(() => client.close()))
      yield* toolsUntil(client, (n) => n.includes(TOOL))
      expect(textOf(yield* Effect.promise(() => client.callTool({ name: TOOL, arguments: { text: "h" } })))).toBe("shop:getCart:h")

      const trace = yield* Effect.suspend(() => {
        const spans = exporter.getFinishedSpans()
        const call = spans.find((s) => s.name === "registry.call")
        const trace = call === undefined ? [] : spans.filter((s) => s.spanContext().traceId === call.spanContext().traceId)
        return trace.some((s) => s.name === "edge.deliver" && s.attributes["sb.transport"] === "http")
          ? Effect.succeed(trace)
          : Effect.fail(new NotYet(spans.map((s) => s.name).join(", ")))
      }).pipe(Effect.retry(Schedule.spaced("20 millis").pipe(Schedule.upTo("5 seconds"))), Effect.orDie)

      const call = trace.find((s) => s.name === "registry.call")!
      const receive = trace.find((s) => s.name === "edge.receive" && idOf(s) === parentOf(call))
      expect(call.spanContext().traceId).toBe(hostTrace)
      expect(receive?.attributes).toMatchObject({ "sb.transport": "http", "sb.path": "/hub" })
      expect(receive?.parentSpanContext?.spanId).toBe(hostSpan)
      const reply = trace.find((s) => s.name === "registry.reply")!
      expect(trace.find((s) => s.name === "edge.deliver" && parentOf(s) === idOf(reply))?.attributes["sb.transport"]).toBe("http")
    }))

  it.scopedLive("MCP 2026-07-28: a traceparent in the request's _meta roots the trace, from the edge through the registry to the tab and back", () =>
    Effect.gen(function*() {
      const exporter = new InMemorySpanExporter()
      const ctx = yield* Layer.build(stack(busLayer(), { services: Registry.layer, tracing: Telemetry.layerMemory("switchboard", exporter) }))
      const base = Context.get(ctx, Edge.EdgeServer).url
      yield* tab(base.replace("http", "ws"), page("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      const hostTrace = "0af7651916cd43dd8448eb211c80319c"
      const hostSpan = "b7ad6b7169203331"
      const t = yield* token({ sub: "alice" })
      const meta = { ...modernMeta(), traceparent: `00-${hostTrace}-${hostSpan}-01` }
      const post = (body: Record<string, unknown>) => Effect.map(modernPost(base, body, { token: t }), (r) => r.json() as { result?: { tools?: Array<{ name: string }> } })
      yield* post({ jsonrpc: "2.0", id: 1, method: "tools/list", params: { _meta: meta } }).pipe(
        Effect.filterOrFail((r) => r.result?.tools?.some((tool) => tool.name === TOOL) === true, () => new NotYet("no tool yet")),
        Effect.retry(Schedule.spaced("20 millis").pipe(Schedule.upTo("5 seconds"))),
        Effect.orDie
      )
      expect(textOf((yield* post({ jsonrpc: "2.0", id: 2, method: "tools/call", params: { name: TOOL, arguments: { text: "m" }, _meta: meta } })).result)).toBe("shop:getCart:m")

      const trace = yield* Effect.suspend(() => {
        const spans = exporter.getFinishedSpans().filter((s) => s.spanContext().traceId === hostTrace)
        return spans.filter((s) => s.name === "edge.deliver").length >= 2 && spans.some((s) => s.name === "registry.reply")
          ? Effect.succeed(spans)
          : Effect.fail(new NotYet(spans.map((s) => s.name).join(", ")))
      }).pipe(Effect.retry(Schedule.spaced("20 millis").pipe(Schedule.upTo("5 seconds"))), Effect.orDie)

      const call = trace.find((s) => s.name === "registry.call")!
      const receive = trace.find((s) => s.name === "edge.receive" && idOf(s) === parentOf(call))
      expect(receive?.parentSpanContext?.spanId).toBe(hostSpan)
      expect(receive?.attributes).toMatchObject({ "sb.transport": "http", "sb.path": "/hub", "mcp.protocol.version": "2026-07-28", "rpc.method": "tools/call" })
      expect(call.attributes).toMatchObject({ "rpc.method": "tools/call", "mcp.tool.name": TOOL, "user_id": "alice" })
      const reply = trace.find((s) => s.name === "registry.reply")!
      expect(parentOf(reply)).toBe(idOf(call))
      // To the tab (the call's child) and back to the host (the reply's child).
      expect(trace.some((s) => s.name === "edge.deliver" && parentOf(s) === idOf(call))).toBe(true)
      expect(trace.find((s) => s.name === "edge.deliver" && parentOf(s) === idOf(reply))?.attributes["sb.transport"]).toBe("http")
    }))
})

