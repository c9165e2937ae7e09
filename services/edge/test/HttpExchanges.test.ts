/**
 * In-flight Streamable HTTP responses through their own interface, behind a real `node:http`
 * server on loopback: a POST's lone answer is JSON, something before it makes the response SSE, a
 * client that stops reading is cut at EDGE_OUTBOUND_HWM, and a client's own close is told apart
 * from a cut. No session and no bus: the caller is the test.
 */
import { describe, expect, it } from "@effect/vitest"
import { Telemetry } from "@switchboard/telemetry"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Queue from "effect/Queue"
import * as Net from "node:net"
import * as Boundary from "../src/Boundary.ts"
import * as HttpExchanges from "../src/HttpExchanges.ts"
import { EdgeMetrics } from "../src/Metrics.ts"
import { listen, settings } from "./support.ts"

const HWM = 64 * 1024

const env = (more: Readonly<Record<string, string>> = {}) => Layer.merge(Telemetry.disabled, settings({ EDGE_OUTBOUND_HWM: String(HWM), ...more }))

type Lost = { readonly n: HttpExchanges.ExchangeId; readonly by: "cut"; readonly reason: string } | { readonly n: HttpExchanges.ExchangeId; readonly by: "client" }

/** Exchanges behind a server: a POST opens one for request id 1, a GET a stream; the test hears of each opened, and each lost. */
const serveWith = (more: Readonly<Record<string, string>>) => Effect.gen(function*() {
  const metrics = new EdgeMetrics()
  const boundary = yield* Boundary.make
  const exchanges = yield* HttpExchanges.make({ edgeId: "edge-unit", metrics, runFork: boundary.runFork, logCaught: boundary.logCaught })
  const opened = yield* Queue.unbounded<HttpExchanges.ExchangeId>()
  const lost = yield* Queue.unbounded<Lost>()
  const losses: HttpExchanges.Losses = {
    onCut: (n, reason) => void Queue.unsafeOffer(lost, { n, by: "cut", reason }),
    onClosed: (n) => void Queue.unsafeOffer(lost, { n, by: "client" })
  }
  const server = yield* listen({
    onRequest: (req, res) => {
      const exchange = { res, key: "k1", user: "alice", headers: { "x-exchange": "k1" }, ...losses }
      Queue.unsafeOffer(opened, req.method === "GET" ? exchanges.stream({ ...exchange, primes: true }) : exchanges.post({ ...exchange, id: 1 }))
    }
  })
  return { ...server, exchanges, metrics, opened, lost }
}).pipe(Effect.provide(env(more)))
const serve = serveWith({})

const text = (s: string) => new TextEncoder().encode(s)
const ANSWER = JSON.stringify({ jsonrpc: "2.0", id: 1, result: { ok: true } })

/** A request whose answer the test awaits later; `signal` lets it go away first. */
const request = (url: string, method: "POST" | "GET", signal?: AbortSignal) =>
  Effect.tryPromise(async () => {
    const res = await fetch(url, { method, ...(method === "POST" ? { body: "{}" } : {}), ...(signal === undefined ? {} : { signal }) })
    return { status: res.status, type: res.headers.get("content-type"), exchange: res.headers.get("x-exchange"), body: await res.text() }
  }).pipe(Effect.fork)

describe("Streamable HTTP exchanges", () => {
  it.scopedLive("answer a POST with JSON when its answer comes first, and take nothing more after it", () =>
    Effect.gen(function*() {
      const edge = yield* serve
      const answer = yield* request(edge.http, "POST")
      const n = yield* Queue.take(edge.opened)
      edge.exchanges.deliver(n, { data: text(ANSWER), end: true })
      edge.exchanges.deliver(n, { data: text("late"), end: true })
      expect(yield* Fiber.join(answer)).toEqual({ status: 200, type: "application/json", exchange: "k1", body: ANSWER })
      // Answered is not lost: neither a cut nor a close is told.
      expect(yield* Queue.size(edge.lost)).toBe(0)
    }))

  it.scopedLive("turn a POST's response into SSE when a notification comes before the answer", () =>
    Effect.gen(function*() {
      const edge = yield* serve
      const answer = yield* request(edge.http, "POST")
      const n = yield* Queue.take(edge.opened)
      edge.exchanges.deliver(n, { data: text("{\"method\":\"notifications/progress\"}\n{\"second\":\"line\"}"), end: false })
      edge.exchanges.deliver(n, { data: text(ANSWER), end: true })
      const got = yield* Fiber.join(answer)
      expect([got.status, got.type, got.exchange]).toEqual([200, "text/event-stream", "k1"])
      // A line break inside a message would end its data field: each line gets its own.
      expect(got.body).toBe(`data: {"method":"notifications/progress"}\ndata: {"second":"line"}\n\ndata: ${ANSWER}\n\n`)
    }))

  it.scopedLive("answer a POST 504 once EDGE_HTTP_RESPONSE_TIMEOUT passes without its answer, and end an SSE one, both then closed to deliveries", () =>
    Effect.gen(function*() {
      // POSTs have no timer each but a swept deadline: both kinds still end, whenever the sweep comes.
      const edge = yield* serveWith({ EDGE_HTTP_RESPONSE_TIMEOUT: "200 millis" })
      const silent = yield* request(edge.http, "POST")
      const quiet = yield* Queue.take(edge.opened)
      const notified = yield* request(edge.http, "POST")
      const streaming = yield* Queue.take(edge.opened)
      edge.exchanges.deliver(streaming, { data: text("{\"method\":\"notifications/progress\"}"), end: false })
      const got = yield* Fiber.join(silent)
      expect([got.status, got.type]).toEqual([504, "application/json"])
      expect(JSON.parse(got.body)).toMatchObject({ id: 1, error: { message: "the session did not answer in time" } })
      const stream = yield* Fiber.join(notified)
      expect([stream.status, stream.type]).toEqual([200, "text/event-stream"])
      expect(stream.body).toBe("data: {\"method\":\"notifications/progress\"}\n\n")
      // Timed out is neither cut nor closed by its client, and an answer after it finds nothing open.
      edge.exchanges.deliver(quiet, { data: text(ANSWER), end: true })
      edge.exchanges.deliver(streaming, { data: text(ANSWER), end: true })
      expect(yield* Queue.size(edge.lost)).toBe(0)
    }))

  it.scopedLive("open a GET stream at its first delivery, primed with its event id, and end it with the others", () =>
    Effect.gen(function*() {
      const edge = yield* serve
      const stream = yield* request(edge.http, "GET")
      const n = yield* Queue.take(edge.opened)
      edge.exchanges.deliver(n, { data: new Uint8Array(), end: false, eventId: "e0" })
      edge.exchanges.deliver(n, { data: text("{\"method\":\"notifications/tools/list_changed\"}"), end: false, eventId: "e1" })
      expect(edge.exchanges.endStreams()).toBe(1)
      const got = yield* Fiber.join(stream)
      expect([got.status, got.type, got.exchange]).toEqual([200, "text/event-stream", "k1"])
      expect(got.body).toBe("id: e0\ndata: \n\nid: e1\ndata: {\"method\":\"notifications/tools/list_changed\"}\n\n")
    }))

  it.scopedLive("cut a response whose client stops reading once more than EDGE_OUTBOUND_HWM would wait, and tell it as a cut", () =>
    Effect.gen(function*() {
      const edge = yield* serve
      const closed = yield* Deferred.make<void>()
      // A client that sends its request and never reads: what the edge writes piles up in it.
      const client = yield* Effect.acquireRelease(
        Effect.sync(() => {
          const socket = Net.connect(edge.port, "127.0.0.1")
          socket.pause()
          socket.on("error", () => {})
          socket.on("close", () => Deferred.unsafeDone(closed, Effect.void))
          socket.write("POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}")
          return socket
        }),
        (socket) => Effect.sync(() => socket.destroy())
      )
      const n = yield* Queue.take(edge.opened)
      const chunk = text(JSON.stringify({ method: "notifications/message", params: { data: "x".repeat(16 * 1024) } }))
      // Until the kernel's buffers on both ends are full nothing waits in the response; at most 64 MiB.
      let sent = 0
      while ((yield* Queue.size(edge.lost)) === 0 && sent < 4096) {
        edge.exchanges.deliver(n, { data: chunk, end: false })
        sent++
        if (sent % 64 === 0) yield* Effect.yieldNow()
      }
      expect(yield* Queue.take(edge.lost)).toEqual({ n, by: "cut", reason: `slow consumer: more than ${HWM} bytes waiting (EDGE_OUTBOUND_HWM)` })
      expect(edge.metrics.httpCuts.get("buffer")).toBe(1)
      // The client reads again, and finds the response ended.
      client.resume()
      yield* Deferred.await(closed)
      // A cut response is gone: it takes nothing more, and its close is not told again as the client's.
      edge.exchanges.deliver(n, { data: text(ANSWER), end: true })
      expect(yield* Queue.size(edge.lost)).toBe(0)
    }))

  it.scopedLive("tell a client's close before the answer apart from a cut, and take nothing for it after", () =>
    Effect.gen(function*() {
      const edge = yield* serve
      const abort = new AbortController()
      const answer = yield* request(edge.http, "POST", abort.signal)
      const n = yield* Queue.take(edge.opened)
      abort.abort()
      expect(yield* Queue.take(edge.lost)).toEqual({ n, by: "client" })
      expect(yield* Fiber.await(answer).pipe(Effect.map((exit) => exit._tag))).toBe("Failure")
      edge.exchanges.deliver(n, { data: text(ANSWER), end: true })
      expect(edge.metrics.httpCuts.size).toBe(0)
      expect(yield* Queue.size(edge.lost)).toBe(0)
    }))
}, { timeout: 30_000 })
