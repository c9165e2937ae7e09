/**
 * The HTTP routes alone, on the embedded bus with the real auth client behind them: probes,
 * metrics, a request a service answers over the bus (and what the client gets when none does),
 * the `/embed` page, Streamable HTTP wired at `/hub`, and the answers for every other path.
 */
import { describe, expect, it } from "@effect/vitest"
import { AuthClient } from "@switchboard/auth"
import { Kv, MemoryBus, Peer, Subjects } from "@switchboard/bus"
import { Edge as EdgeProtocol } from "@switchboard/protocol"
import { Telemetry } from "@switchboard/telemetry"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Boundary from "../src/Boundary.ts"
import * as OriginPolicy from "../src/OriginPolicy.ts"
import * as HttpRoutes from "../src/HttpRoutes.ts"
import { EdgeMetrics } from "../src/Metrics.ts"
import { standard, standardHttp } from "../src/Routes.ts"
import { Turn } from "../src/Turn.ts"
import { eventually, listen, rawStatus, settings } from "./support.ts"

const script = join(mkdtempSync(join(tmpdir(), "sb-embed-")), "embed.js")
writeFileSync(script, "/* the embed page's script */\n")

const env = AuthClient.layer.pipe(
  Layer.provideMerge(MemoryBus.layer),
  Layer.provideMerge(Telemetry.disabled),
  Layer.provide(settings({ EMBED_SCRIPT: script, EMBED_ALLOWED_ORIGINS: "https://app.example" }))
)

/** How a service answers what the edge forwards (the broker's admin API does the same). */
const httpPeers = Peer.protocol(EdgeProtocol.ServiceHttp)

const serve = Effect.gen(function*() {
  let shuttingDown = false
  const metrics = new EdgeMetrics()
  const routes = yield* HttpRoutes.make({
    edgeId: Subjects.EdgeId("edge-unit"),
    routes: standard,
    httpRoutes: standardHttp,
    policy: OriginPolicy.make({ allowedOrigins: Option.some(["https://app.example"]), bindAddress: "127.0.0.1", publicUrl: Option.none() }),
    maxTokenBytes: 8192,
    openTimeout: "2 seconds",
    metrics,
    turn: new Turn(),
    boundary: yield* Boundary.make,
    isShuttingDown: () => shuttingDown
  })
  const server = yield* listen({ onRequest: routes.onRequest })
  return { ...server, routes, metrics, shutDown: () => (shuttingDown = true) }
})

interface Answer {
  readonly status: number
  readonly type: string
  readonly body: string
  readonly headers: Headers
}

const request = (url: string, init: RequestInit = {}) =>
  Effect.promise(async (): Promise<Answer> => {
    const res = await fetch(url, init)
    return { status: res.status, type: res.headers.get("content-type") ?? "", body: await res.text(), headers: res.headers }
  })

const statusAndBody = (a: Answer) => [a.status, a.body]

describe("the edge's HTTP routes", () => {
  it.scopedLive("answers liveness, metrics, 426 at a WebSocket path, 404 elsewhere and 400 for a target that is no URL", () =>
    Effect.gen(function*() {
      const edge = yield* serve
      expect(statusAndBody(yield* request(`${edge.http}/healthz`))).toEqual([200, "ok\n"])
      edge.metrics.opened("/mcp")
      const metrics = yield* request(`${edge.http}/metrics`)
      expect(metrics.type).toBe("text/plain; version=0.0.4")
      expect(metrics.body).toContain(`switchboard_edge_connections{path="/mcp"} 1`)
      expect(statusAndBody(yield* request(`${edge.http}/mcp`))).toEqual([426, "this endpoint speaks WebSocket\n"])
      expect(statusAndBody(yield* request(`${edge.http}/nowhere`))).toEqual([404, "not found\n"])
      expect(yield* rawStatus(edge.port, "GET // HTTP/1.1\r\nHost: x\r\n\r\n")).toBe(400)
    }).pipe(Effect.provide(env)))

  it.scopedLive("is ready only while some service it routes to has a live replica, and not while shutting down", () =>
    Effect.gen(function*() {
      const edge = yield* serve
      expect(statusAndBody(yield* request(`${edge.http}/readyz`))).toEqual([
        503,
        "not ready: no live replica of router, broker, registry, so every upgrade would be refused\n"
      ])
      const replicas = yield* (yield* Kv.Kv).bucket(Subjects.Bucket.replicas)
      yield* replicas.put(Subjects.Key.replica("router", "r1"), String(Date.now()))
      // Readiness looks at the replica keys at most once a second.
      const ready = yield* eventually(
        Effect.filterOrFail(request(`${edge.http}/readyz`), (a) => a.status === 200)
      )
      expect(ready.body).toBe("ready, but no live replica of broker, registry\n")
      edge.shutDown()
      expect(statusAndBody(yield* request(`${edge.http}/readyz`))).toEqual([503, "shutting down\n"])
    }).pipe(Effect.provide(env)))

  it.scopedLive("forwards a request under a service's prefix over the bus, and answers 503 or 413 for what it cannot forward", () =>
    Effect.gen(function*() {
      const edge = yield* serve
      expect(statusAndBody(yield* request(`${edge.http}/v0/topics`))).toEqual([503, "broker service unavailable\n"])
      // A service that echoes what it was asked, decoded: the edge asked it in the protocol's types.
      yield* httpPeers.serve(Subjects.http("broker"), (message, reply) => {
        const { _tag, ...asked } = message
        return reply(message).succeed({ status: 201, body: { tag: _tag, asked } })
      })
      const answer = yield* request(`${edge.http}/admin/participants/p1/promote?x=1`, {
        method: "POST",
        body: "{\"to\":\"full\"}",
        headers: { authorization: "Bearer admin" }
      })
      expect([answer.status, answer.type]).toEqual([201, "application/json"])
      expect(JSON.parse(answer.body)).toEqual({
        tag: "HttpForward",
        asked: {
          method: "POST",
          path: "/admin/participants/p1/promote",
          query: { x: "1" },
          body: "{\"to\":\"full\"}",
          authorization: "Bearer admin",
          // The base the client reached, for URLs in answers.
          base: edge.http
        }
      })
      const large = yield* request(`${edge.http}/v0/topics`, { method: "POST", body: "x".repeat(65 * 1024) }).pipe(
        Effect.map(statusAndBody),
        Effect.catchAllDefect(() => Effect.succeed("cut"))
      )
      expect(large).toEqual([413, "request body too large\n"])
    }).pipe(Effect.provide(env)))

  it.scopedLive("serves the /embed page and its script, and Streamable HTTP at /hub", () =>
    Effect.gen(function*() {
      const edge = yield* serve
      const page = yield* request(`${edge.http}/embed`)
      expect([page.status, page.type]).toEqual([200, "text/html; charset=utf-8"])
      expect(page.headers.get("content-security-policy")).toContain("frame-ancestors https://app.example")
      expect(statusAndBody(yield* request(`${edge.http}/embed/embed.js`))).toEqual([200, "/* the embed page's script */\n"])
      expect(edge.routes.deliver).toBeDefined()
      // Streamable HTTP answers at the hub's path: without a token, 401 with where to get one.
      const hub = yield* request(`${edge.http}/hub`, {
        method: "POST",
        headers: { "content-type": "application/json", accept: "application/json, text/event-stream" },
        body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: {} })
      })
      expect(hub.status).toBe(401)
      expect(hub.headers.get("www-authenticate")).toContain("resource_metadata=")
    }).pipe(Effect.provide(env)))
})
