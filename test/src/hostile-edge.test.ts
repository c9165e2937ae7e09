/**
 * The edge against peers that mean harm or have bugs (issue 12): request targets `new URL`
 * refuses, services that answer what Node or ws cannot write, too many sockets from one address or
 * one user, headers sent a byte at a time, and a slow consumer counted under the code it was sent.
 */
import { describe, expect, it } from "@effect/vitest"
import { Actors, Bus, Peer, Subjects } from "@switchboard/bus"
import { Edge } from "@switchboard/edge"
import { Edge as EdgeProtocol } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import type * as Net from "node:net"
import { closedWith, connect, rawStatus, UpgradeRefused } from "./support/Client.ts"
import * as Echo from "./support/Echo.ts"
import { busLayer, stack, type StackOptions, token } from "./support/Stack.ts"

/**
 * A service on `/closer` that closes its socket with whatever code a frame names: a service's bug
 * (a code no close frame may carry) reaches the edge as a bus message. It stands in for the broker,
 * whose name it takes.
 */
const closer = Layer.scopedDiscard(
  Actors.host({
    service: "broker",
    make: (conn) => Effect.succeed({ onFrame: (frame) => Effect.sync(() => conn.close(Number(frame.text), "as asked")) })
  })
)

const routes = {
  ...Echo.routes,
  "/private": { service: "echo", auth: "upgrade", traceInbound: true },
  "/closer": { service: "broker", auth: "optional", traceInbound: true }
} as const

const start = (options: StackOptions = {}) =>
  Effect.gen(function*() {
    const ctx = yield* Layer.build(stack(busLayer(), { routes, services: Layer.merge(Echo.layer, closer), ...options }))
    const edge = ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape
    const bus = ctx.unsafeMap.get(Bus.Bus.key) as Bus.BusShape
    return { edge, bus, ws: edge.url.replace("http", "ws") }
  })

const upgradeHeaders = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"

/** The HTTP status an upgrade was refused with, and the body that says why. */
const refusal = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.either(effect).pipe(
    Effect.map((r) => (r._tag === "Right" ? "accepted" : r.left instanceof UpgradeRefused ? { status: r.left.status, body: r.left.body } : `failed: ${String(r.left)}`))
  )

/** The edge sees a client's close a moment after the client does: retry until a socket is taken, bounded. */
const acceptedSoon = <A, E, R>(open: Effect.Effect<A, E, R>) =>
  open.pipe(Effect.retry(Schedule.spaced("20 millis").pipe(Schedule.upTo("5 seconds"))))

const metricsText = (edge: Edge.EdgeServerShape) => Effect.promise(() => fetch(`${edge.url}/metrics`).then((r) => r.text()))

/** The edge still does its job: health, and a socket that relays. */
const stillServes = (edge: Edge.EdgeServerShape, ws: string) =>
  Effect.gen(function*() {
    const health = yield* Effect.promise(() => fetch(`${edge.url}/healthz`))
    expect(health.status).toBe(200)
    const c = yield* connect(`${ws}/echo`)
    c.send("still here")
    expect(yield* c.nextText).toBe("still here")
  })

describe("edge against hostile peers", () => {
  it.scopedLive("answers request targets that are no URL with 400, as requests and as upgrades, and serves on", () =>
    Effect.gen(function*() {
      const { edge, ws } = yield* start()
      for (const target of ["//", "http://[::1", "//:x", "http://exa mple/"]) {
        const plain = yield* rawStatus(edge.port, `GET ${target} HTTP/1.1\r\nHost: localhost\r\n\r\n`)
        const upgrade = yield* rawStatus(edge.port, `GET ${target} HTTP/1.1\r\nHost: localhost\r\n${upgradeHeaders}\r\n`)
        expect([target, plain, upgrade]).toEqual([target, 400, 400])
      }
      // Targets that are URLs, but of no endpoint.
      expect(yield* rawStatus(edge.port, `GET //healthz HTTP/1.1\r\nHost: localhost\r\n\r\n`)).toBe(404)
      expect(yield* rawStatus(edge.port, `GET http://elsewhere/nowhere HTTP/1.1\r\nHost: localhost\r\n${upgradeHeaders}\r\n`)).toBe(404)
      yield* stillServes(edge, ws)
    }))

  it.scopedLive("answers 500 when a service's HTTP answer cannot be written, and closes 1011 for a close code no frame may carry", () =>
    Effect.gen(function*() {
      const { bus, edge, ws } = yield* start()
      // A broker with bugs: a status Node refuses to write, and an answer without a body.
      yield* Peer.protocol(EdgeProtocol.ServiceHttp).serve(Subjects.http("broker"), (message, reply) =>
        reply(message).succeed(message.path === "/v0/topics" ? { status: 42, body: {} } : { status: 200, body: undefined })
      ).pipe(Effect.provideService(Bus.Bus, bus))
      const statuses = yield* Effect.forEach(["/v0/topics", "/admin/anything"], (path) => Effect.promise(() => fetch(`${edge.url}${path}`).then((r) => r.status)))
      expect(statuses).toEqual([500, 500])
      const c = yield* connect(`${ws}/closer`)
      c.send("999")
      expect(yield* closedWith(c)).toEqual({ code: 1011, reason: "invalid close code 999" })
      yield* stillServes(edge, ws)
    }))

  it.scopedLive("refuses a remote address's sockets past its cap with 429, and takes one again once one closes", () =>
    Effect.gen(function*() {
      const { edge, ws } = yield* start({ env: { EDGE_MAX_CONNECTIONS_PER_ADDRESS: "3" } })
      const [first] = [yield* connect(`${ws}/echo`), yield* connect(`${ws}/echo`), yield* connect(`${ws}/private?token=${yield* token({ sub: "alice" })}`)]
      expect(yield* refusal(connect(`${ws}/echo`))).toEqual({ status: 429, body: "too many connections from 127.0.0.1 (at most 3)" })
      // Refused before anything else is looked at, so a refused socket costs no token check.
      expect(yield* refusal(connect(`${ws}/private`))).toMatchObject({ status: 429 })
      first!.ws.close()
      yield* closedWith(first!)
      const again = yield* acceptedSoon(connect(`${ws}/echo`))
      again.send("in")
      expect(yield* again.nextText).toBe("in")
      expect(edge.connections()).toBe(3)
    }))

  it.scopedLive("refuses a user's sockets past the per-user cap with 429, whatever the path, and others' not", () =>
    Effect.gen(function*() {
      const { ws } = yield* start({ env: { EDGE_MAX_CONNECTIONS_PER_USER: "3" } })
      const alice = yield* token({ sub: "alice" })
      const bob = yield* token({ sub: "bob" })
      const [first] = [
        yield* connect(`${ws}/private?token=${alice}`),
        yield* connect(`${ws}/private`, { headers: { authorization: `Bearer ${alice}` } }),
        yield* connect(`${ws}/echo?token=${alice}`)
      ]
      expect(yield* refusal(connect(`${ws}/private?token=${alice}`))).toEqual({ status: 429, body: "too many connections for user alice (at most 3)" })
      expect(yield* refusal(connect(`${ws}/echo?token=${alice}`))).toMatchObject({ status: 429 })
      // Anonymous sockets and other users are not alice's.
      yield* connect(`${ws}/echo`)
      yield* connect(`${ws}/private?token=${bob}`)
      first!.ws.close()
      yield* closedWith(first!)
      const again = yield* acceptedSoon(connect(`${ws}/private?token=${alice}`))
      again.send("back")
      expect(yield* again.nextText).toBe("back")
    }))

  it.scopedLive("closes a connection whose headers do not arrive in time", () =>
    Effect.gen(function*() {
      const { edge, ws } = yield* start({ env: { EDGE_HEADERS_TIMEOUT: "500 millis", EDGE_REQUEST_TIMEOUT: "1 second" } })
      // An upgrade whose last header line never comes.
      const answer = yield* rawStatus(edge.port, `GET /echo HTTP/1.1\r\nHost: edge\r\n${upgradeHeaders}`)
      expect([408, "closed"]).toContain(answer)
      yield* stillServes(edge, ws)
    }))

  it.scopedLive("counts a slow consumer it closed with 1013 as 1013, though the peer never read the close", () =>
    Effect.gen(function*() {
      const { edge, ws } = yield* start({ env: { EDGE_OUTBOUND_HWM: "65536", EDGE_SHUTDOWN_GRACE: "300 millis" } })
      const slow = yield* connect(`${ws}/echo`)
      // Stops reading: the kernel's buffers fill, then the edge's passes the high-water mark, and the
      // close frame waits behind it until the edge gives up and cuts the connection.
      const raw = (slow.ws as unknown as { _socket: Net.Socket })._socket
      raw.pause()
      const frame = "z".repeat(60_000)
      for (let i = 0; i < 500 && edge.connections() > 0; i++) {
        slow.send(frame)
        yield* Effect.sleep("1 millis")
      }
      const closes = yield* metricsText(edge).pipe(
        Effect.filterOrFail((m) => m.includes("switchboard_edge_closes_total{"), () => new Error("no close counted yet")),
        Effect.retry(Schedule.spaced("50 millis").pipe(Schedule.upTo("10 seconds")))
      )
      expect(closes).toContain('switchboard_edge_closes_total{code="1013"} 1')
      expect(closes).not.toContain('code="1006"')
    }), 30_000)
})
