/**
 * One forwarded request is one trace: the client's frame at the edge, the router forwarding it,
 * the edge delivering it to the extension, the router replying and the edge delivering the answer.
 * Checked on the embedded bus and across NATS (edges and router on connections of their own,
 * sharing one in-memory exporter, which is why they run in this process rather than as processes).
 */
import { describe, expect, it } from "@effect/vitest"
import { InMemorySpanExporter, type ReadableSpan } from "@opentelemetry/sdk-trace-base"
import { AuthClient, AuthService, Tokens } from "@switchboard/auth"
import { Edge } from "@switchboard/edge"
import { Router } from "@switchboard/router"
import { Telemetry } from "@switchboard/telemetry"
import { NatsServer } from "@switchboard/testing"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import { attach, client, extensionOf, next } from "./support/ProxyPeers.ts"
import { busLayer, configFrom, namespace, stack } from "./support/Stack.ts"

const USER = "alice"
const REQUEST_ID = 7

/**
 * An extension on one edge, an MCP client on another (or the same), and one `createTab` between
 * them. Returns the connection id the router gave the client.
 */
const createTabRoundTrip = (extensionEdge: string, clientEdge: string) =>
  Effect.gen(function*() {
    const ext = yield* extensionOf(extensionEdge, USER)
    const c = yield* client(clientEdge, USER)
    const connectionId = yield* attach(c, ext.id)
    c.send({ jsonrpc: "2.0", id: REQUEST_ID, method: "createTab", params: { url: "https://example.com" } })
    const forwarded = yield* next(ext.c)
    ext.c.send({ jsonrpc: "2.0", id: forwarded.id, result: { tabId: 42 } })
    expect(yield* next(c)).toEqual({ jsonrpc: "2.0", id: REQUEST_ID, result: { tabId: 42 } })
    return connectionId
  })

class NotYet extends Error {}

/**
 * The trace of the forwarded request, once all five spans have ended: the last `edge.deliver`
 * ends just after the client has its answer, so this polls the exporter, briefly and boundedly.
 */
const traceOfForward = (exporter: InMemorySpanExporter) =>
  Effect.suspend(() => {
    const spans = exporter.getFinishedSpans()
    const forward = spans.find((s) => s.name === "router.forward createTab")
    const trace = forward === undefined ? [] : spans.filter((s) => s.spanContext().traceId === forward.spanContext().traceId)
    return trace.length >= 5 ? Effect.succeed({ spans, trace }) : Effect.fail(new NotYet(`spans so far: ${spans.map((s) => s.name).join(", ")}`))
  }).pipe(Effect.retry(Schedule.spaced("20 millis").pipe(Schedule.upTo("5 seconds"))), Effect.orDie)

const only = (spans: ReadonlyArray<ReadableSpan>, name: string) => {
  const found = spans.filter((s) => s.name === name)
  const [span] = found
  if (found.length !== 1 || span === undefined) throw new Error(`expected one ${name} span, found ${found.length}`)
  return span
}
const parentOf = (s: ReadableSpan) => s.parentSpanContext?.spanId
const idOf = (s: ReadableSpan) => s.spanContext().spanId
/** Which process (provider) recorded the span: its resource's `service.name`, as a backend groups them. */
const serviceOf = (s: ReadableSpan) => s.resource.attributes["service.name"]

/** Asserts the shape of the trace and returns its spans by role. */
const assertOneTrace = (exporter: InMemorySpanExporter, connectionId: string) =>
  Effect.gen(function*() {
    const { spans, trace } = yield* traceOfForward(exporter)
    expect(trace.map((s) => s.name).sort()).toEqual(["edge.deliver", "edge.deliver", "edge.receive", "router.forward createTab", "router.reply createTab"])
    // Nothing of this request leaked into another trace.
    for (const name of ["router.forward createTab", "router.reply createTab", "edge.deliver"]) {
      expect(spans.filter((s) => s.name === name)).toEqual(trace.filter((s) => s.name === name))
    }
    // The extension's frames are answers: the router continues the request's trace instead.
    expect(spans.filter((s) => s.name === "edge.receive" && s.attributes["sb.path"] === "/extension")).toEqual([])

    const receive = only(trace, "edge.receive")
    const forward = only(trace, "router.forward createTab")
    const reply = only(trace, "router.reply createTab")
    const delivers = trace.filter((s) => s.name === "edge.deliver")
    const toExtension = delivers.find((s) => parentOf(s) === idOf(forward))
    const toClient = delivers.find((s) => parentOf(s) === idOf(reply))

    expect(parentOf(receive)).toBeUndefined()
    expect(parentOf(forward)).toBe(idOf(receive))
    expect(parentOf(reply)).toBe(idOf(forward))
    expect(toExtension).toBeDefined()
    expect(toClient).toBeDefined()

    const clientConn = receive.attributes["sb.conn"]
    const mapped = `${connectionId}:${REQUEST_ID}`
    expect(receive.attributes).toMatchObject({ "sb.path": "/mcp" })
    expect(forward.attributes).toMatchObject({
      "rpc.method": "createTab",
      "mcp.request.id": String(REQUEST_ID),
      "mcp.mapped_id": mapped,
      "sb.conn": clientConn,
      "connection_id": connectionId,
      "user_id": USER
    })
    expect(reply.attributes).toMatchObject({
      "rpc.method": "createTab",
      "mcp.request.id": String(REQUEST_ID),
      "mcp.mapped_id": mapped,
      "sb.conn": clientConn,
      "connection_id": connectionId,
      "user_id": USER
    })
    expect(toClient?.attributes["sb.conn"]).toBe(clientConn)
    expect(toExtension?.attributes["sb.conn"]).not.toBe(clientConn)
    return { receive, forward, reply, toExtension, toClient }
  })

const quiet = Logger.minimumLogLevel(LogLevel.Error)

/** Edges and router as layers of their own, each with its own NATS connection and tracer provider. */
const overNats = (exporter: InMemorySpanExporter) =>
  Effect.gen(function*() {
    const { servers } = yield* NatsServer
    const ns = namespace()
    const connection = (service: string) =>
      Layer.merge(Telemetry.layerMemory(service, exporter), busLayer(servers, ns))
    const router = Router.layer.pipe(
      Layer.provideMerge(AuthClient.layer),
      Layer.provideMerge(AuthService.layer),
      Layer.provideMerge(Tokens.layer),
      Layer.provideMerge(connection("switchboard-router")),
      Layer.provide(configFrom({})),
      Layer.provide(quiet)
    )
    const edge = (service: string) =>
      Edge.layer().pipe(Layer.provideMerge(AuthClient.layer), Layer.provideMerge(connection(service)), Layer.provide(configFrom({})), Layer.provide(quiet))
    yield* Layer.build(router)
    const a = Context.get(yield* Layer.build(edge("switchboard-edge-a")), Edge.EdgeServer)
    const b = Context.get(yield* Layer.build(edge("switchboard-edge-b")), Edge.EdgeServer)
    return { a: a.url.replace("http", "ws"), b: b.url.replace("http", "ws") }
  })

const withNats = <A, E>(test: Effect.Effect<A, E, NatsServer | Scope.Scope>) => Effect.scoped(test).pipe(Effect.provide(NatsServer.layer))

describe("proxy tracing", () => {
  it.scopedLive("one createTab round trip is one trace, its spans in parent/child order, on the embedded bus", () =>
    Effect.gen(function*() {
      const exporter = new InMemorySpanExporter()
      const ctx = yield* Layer.build(stack(busLayer(), { services: Router.layer, tracing: Telemetry.layerMemory("switchboard", exporter) }))
      const ws = Context.get(ctx, Edge.EdgeServer).url.replace("http", "ws")
      const connectionId = yield* createTabRoundTrip(ws, ws)
      yield* assertOneTrace(exporter, connectionId)
    }))

  it.live("one createTab round trip is one trace across NATS, with the extension and the client on different edges", () =>
    Effect.gen(function*() {
      const exporter = new InMemorySpanExporter()
      const { a, b } = yield* overNats(exporter)
      const connectionId = yield* createTabRoundTrip(a, b)
      const spans = yield* assertOneTrace(exporter, connectionId)
      // Each hop was recorded where it happened: the trace context crossed the bus each time.
      expect(serviceOf(spans.receive)).toBe("switchboard-edge-b")
      expect(serviceOf(spans.forward)).toBe("switchboard-router")
      expect(spans.toExtension && serviceOf(spans.toExtension)).toBe("switchboard-edge-a")
      expect(serviceOf(spans.reply)).toBe("switchboard-router")
      expect(spans.toClient && serviceOf(spans.toClient)).toBe("switchboard-edge-b")
    }).pipe(withNats), 60_000)
})
