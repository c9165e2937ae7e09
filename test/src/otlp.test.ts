/**
 * Spans leave each process over OTLP/HTTP, as they do in production: the edge and the router run
 * as separate OS processes with `OTEL_EXPORTER_OTLP_ENDPOINT` set to a receiver in this test (a
 * plain HTTP server decoding the OTLP JSON payload), and one proxied request's whole trace is
 * found there: the edge's and the router's spans, one trace id, every parent link intact.
 * proxy-tracing.test.ts checks the same shape with an in-memory exporter in one process.
 */
import { describe, expect, it } from "@effect/vitest"
import { NatsServer } from "@switchboard/testing"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { modernMeta, modernPost } from "./support/Modern.ts"
import * as Processes from "./support/Processes.ts"
import { attach, client, extensionOf, next } from "./support/ProxyPeers.ts"
import { token } from "./support/Stack.ts"
import { page, tab } from "./support/Tabs.ts"

/** OTLP/JSON (`ExportTraceServiceRequest`), the fields this test reads; ids are hex strings. */
const AnyValue = Schema.Struct({ stringValue: Schema.optional(Schema.String), intValue: Schema.optional(Schema.Union(Schema.String, Schema.Number)) })
const Attributes = Schema.Array(Schema.Struct({ key: Schema.String, value: AnyValue }))
const ExportTraceServiceRequest = Schema.Struct({
  resourceSpans: Schema.Array(Schema.Struct({
    resource: Schema.optional(Schema.Struct({ attributes: Schema.optional(Attributes) })),
    scopeSpans: Schema.Array(Schema.Struct({
      spans: Schema.optional(Schema.Array(Schema.Struct({
        traceId: Schema.String,
        spanId: Schema.String,
        parentSpanId: Schema.optional(Schema.String),
        name: Schema.String,
        attributes: Schema.optional(Attributes)
      })))
    }))
  }))
})
const decodeRequest = Schema.decodeUnknownEither(Schema.parseJson(ExportTraceServiceRequest))

interface ReceivedSpan {
  readonly service: string
  readonly traceId: string
  readonly spanId: string
  /** Absent (or empty, as some encoders write it) for a root span. */
  readonly parentSpanId: string | undefined
  readonly name: string
  readonly attributes: Readonly<Record<string, string>>
}

const flatten = (attributes: typeof Attributes.Type | undefined): Record<string, string> =>
  Object.fromEntries((attributes ?? []).map(({ key, value }) => [key, String(value.stringValue ?? value.intValue ?? "")]))

/** A collector's OTLP/HTTP trace endpoint on a free loopback port, keeping every span it is sent. */
const receiver = Effect.acquireRelease(
  Effect.async<{ readonly server: Http.Server; readonly spans: Array<ReceivedSpan>; readonly contentTypes: Set<string>; readonly malformed: Array<string> }>((resume) => {
    const spans: Array<ReceivedSpan> = []
    const contentTypes = new Set<string>()
    const malformed: Array<string> = []
    const server = Http.createServer((req, res) => {
      const chunks: Array<Buffer> = []
      req.on("data", (c: Buffer) => chunks.push(c))
      req.on("end", () => {
        contentTypes.add(req.headers["content-type"] ?? "")
        const body = Buffer.concat(chunks).toString("utf8")
        const decoded = req.method === "POST" && req.url === "/v1/traces" ? decodeRequest(body) : undefined
        if (decoded === undefined || decoded._tag === "Left") {
          malformed.push(`${req.method} ${req.url}: ${body.slice(0, 200)}`)
          res.writeHead(400).end()
          return
        }
        for (const rs of decoded.right.resourceSpans) {
          const service = flatten(rs.resource?.attributes)["service.name"] ?? ""
          for (const ss of rs.scopeSpans) {
            for (const s of ss.spans ?? []) {
              spans.push({
                service,
                traceId: s.traceId,
                spanId: s.spanId,
                parentSpanId: s.parentSpanId === "" ? undefined : s.parentSpanId,
                name: s.name,
                attributes: flatten(s.attributes)
              })
            }
          }
        }
        res.writeHead(200, { "content-type": "application/json" }).end("{}")
      })
    })
    server.listen(0, "127.0.0.1", () => resume(Effect.succeed({ server, spans, contentTypes, malformed })))
  }),
  ({ server }) =>
    Effect.async<void>((resume) => {
      server.close(() => resume(Effect.void))
      server.closeAllConnections()
    })
)

const withNats = <A, E>(test: Effect.Effect<A, E, NatsServer | Scope.Scope>) => Effect.scoped(test).pipe(Effect.provide(NatsServer.layer))

describe("OTLP/HTTP export", () => {
  it.live("one proxied request's whole trace reaches the collector from the edge and the router processes", () =>
    Effect.gen(function*() {
      const { url } = yield* NatsServer
      const collector = yield* receiver
      const endpoint = `http://127.0.0.1:${(collector.server.address() as AddressInfo).port}`
      // The SDK's batch processor reads its delay from the environment; 5 s by default.
      const env = { OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, OTEL_BSP_SCHEDULE_DELAY: "100" }
      const { edges: [edge] } = yield* Processes.deployment(url, { edges: 1, env })
      if (edge === undefined) return yield* Effect.dieMessage("no edge")

      const ext = yield* extensionOf(edge.ws, "alice")
      const mcp = yield* client(edge.ws, "alice")
      const connectionId = yield* attach(mcp, ext.id)
      mcp.send({ jsonrpc: "2.0", id: 7, method: "createTab", params: { url: "https://example.com" } })
      const forwarded = yield* next(ext.c)
      ext.c.send({ jsonrpc: "2.0", id: forwarded.id, result: { tabId: 42 } })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 7, result: { tabId: 42 } })

      // Exported in batches, after the fact: wait (boundedly) until all five spans have arrived.
      const trace = yield* Effect.suspend(() => {
        const forward = collector.spans.find((s) => s.name === "router.forward createTab")
        const found = forward === undefined ? [] : collector.spans.filter((s) => s.traceId === forward.traceId)
        return found.length >= 5 ? Effect.succeed(found) : Effect.fail(collector.spans.map((s) => `${s.service} ${s.name}`))
      }).pipe(
        Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 400 }),
        Effect.catchAll((seen) => Effect.dieMessage(`the trace never arrived whole; received: ${seen.join(", ")}; malformed: ${collector.malformed.join("; ")}`))
      )

      expect(collector.malformed).toEqual([])
      expect([...collector.contentTypes]).toEqual(["application/json"])
      expect(trace.map((s) => `${s.service} ${s.name}`).sort()).toEqual([
        "switchboard-edge edge.deliver",
        "switchboard-edge edge.deliver",
        "switchboard-edge edge.receive",
        "switchboard-router router.forward createTab",
        "switchboard-router router.reply createTab"
      ])
      expect(trace[0]?.traceId).toMatch(/^[0-9a-f]{32}$/)

      const one = (name: string) => {
        const found = trace.filter((s) => s.name === name)
        expect(found).toHaveLength(1)
        return found[0]!
      }
      const receive = one("edge.receive")
      const forward = one("router.forward createTab")
      const reply = one("router.reply createTab")
      const delivers = trace.filter((s) => s.name === "edge.deliver")
      // Client frame → router maps it → edge delivers to the extension; answer → router unmaps → edge delivers to the client.
      expect(receive.parentSpanId).toBeUndefined()
      expect(forward.parentSpanId).toBe(receive.spanId)
      expect(reply.parentSpanId).toBe(forward.spanId)
      expect(delivers.map((d) => d.parentSpanId).sort()).toEqual([forward.spanId, reply.spanId].sort())
      expect(forward.attributes).toMatchObject({ "mcp.request.id": "7", "mcp.mapped_id": `${connectionId}:7`, "sb.conn": receive.attributes["sb.conn"] })
      // Every parent named in the trace is a span of the trace: no link points outside it.
      const ids = new Set(trace.map((s) => s.spanId))
      for (const s of trace) if (s.parentSpanId !== undefined) expect(ids.has(s.parentSpanId)).toBe(true)
    }).pipe(withNats), 180_000)

  it.live("a 2026-07-28 tool call's trace, rooted at the host's own traceparent, reaches the collector from the edge and the registry processes", () =>
    Effect.gen(function*() {
      const { url } = yield* NatsServer
      const collector = yield* receiver
      const endpoint = `http://127.0.0.1:${(collector.server.address() as AddressInfo).port}`
      const env = { OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, OTEL_BSP_SCHEDULE_DELAY: "100" }
      const { edges: [edge] } = yield* Processes.deployment(url, { edges: 1, registry: true, env })
      if (edge === undefined) return yield* Effect.dieMessage("no edge")
      yield* tab(edge.ws, page("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      const tool = "website_tool_shop_example_com_tab1_getCart"
      const hostTrace = "5bf92f3577b34da6a3ce929d0e0e4736"
      const hostSpan = "10f067aa0ba902b7"
      const t = yield* token({ sub: "alice" })
      const meta = { ...modernMeta(), traceparent: `00-${hostTrace}-${hostSpan}-01` }
      const post = (body: Record<string, unknown>) => Effect.map(modernPost(edge.url, body, { token: t }), (r) => r.text)
      yield* post({ jsonrpc: "2.0", id: 1, method: "tools/list", params: { _meta: meta } }).pipe(
        Effect.filterOrFail((text) => text.includes(tool), (text) => text),
        Effect.retry(Schedule.spaced("50 millis").pipe(Schedule.upTo("10 seconds"))),
        Effect.orDie
      )
      expect(yield* post({ jsonrpc: "2.0", id: 2, method: "tools/call", params: { name: tool, arguments: { text: "o" }, _meta: meta } })).toContain("shop:getCart:o")

      const trace = yield* Effect.suspend(() => {
        const found = collector.spans.filter((s) => s.traceId === hostTrace)
        const names = found.map((s) => s.name)
        return names.includes("registry.reply") && names.filter((n) => n === "edge.deliver").length >= 2
          ? Effect.succeed(found)
          : Effect.fail(collector.spans.map((s) => `${s.service} ${s.name}`))
      }).pipe(
        Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 400 }),
        Effect.catchAll((seen) => Effect.dieMessage(`the trace never arrived whole; received: ${seen.join(", ")}`))
      )
      expect(collector.malformed).toEqual([])
      const call = trace.find((s) => s.name === "registry.call")
      const receive = trace.find((s) => s.name === "edge.receive" && s.spanId === call?.parentSpanId)
      const reply = trace.find((s) => s.name === "registry.reply")
      expect([call?.service, receive?.service, reply?.service]).toEqual(["switchboard-registry", "switchboard-edge", "switchboard-registry"])
      expect(receive?.parentSpanId).toBe(hostSpan)
      expect(reply?.parentSpanId).toBe(call?.spanId)
      // Out to the tab (the call's child) and back to the host (the reply's child).
      expect(trace.some((s) => s.name === "edge.deliver" && s.parentSpanId === call?.spanId)).toBe(true)
      expect(trace.some((s) => s.name === "edge.deliver" && s.parentSpanId === reply?.spanId)).toBe(true)
      // Every parent named in the trace is a span of the trace or the host's own.
      const ids = new Set([...trace.map((s) => s.spanId), hostSpan])
      for (const s of trace) if (s.parentSpanId !== undefined) expect(ids.has(s.parentSpanId)).toBe(true)
    }).pipe(withNats), 180_000)
})
