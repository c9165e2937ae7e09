/**
 * The edge over real sockets, with the echo service behind it: auth at upgrade, Origin, frame
 * rules (binary 1003, oversized 1009), ping/pong, slow consumers (1013), rate limits and shutdown.
 */
import { describe, expect, it } from "@effect/vitest"
import { Actors, Bus, Kv, Subjects } from "@switchboard/bus"
import { Broker } from "@switchboard/broker"
import { Edge } from "@switchboard/edge"
import { Edge as EdgeProtocol } from "@switchboard/protocol"
import { Registry } from "@switchboard/registry"
import { Router } from "@switchboard/router"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Queue from "effect/Queue"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import type * as Net from "node:net"
import { closedWith, connect, UpgradeRefused } from "./support/Client.ts"
import * as Echo from "./support/Echo.ts"
import * as Processes from "./support/Processes.ts"
import { NatsServer } from "@switchboard/testing"
import { busLayer, expiredToken, namespace, stack, type StackOptions, token } from "./support/Stack.ts"

/** Builds an edge + echo stack in its own scope, so a test can shut it down itself. */
const start = (options: StackOptions = {}) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    const ctx = yield* Layer.buildWithScope(
      stack(busLayer(), { routes: { ...Echo.routes, "/v0/ws": { service: "echo", auth: "upgrade", traceInbound: true } }, services: Echo.layer, ...options }),
      scope
    )
    const edge = Edge.EdgeServer.of(ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape)
    yield* Effect.addFinalizer(() => Scope.close(scope, Exit.void))
    return { edge, ws: edge.url.replace("http", "ws"), shutdown: Scope.close(scope, Exit.void) }
  })

/** The HTTP status an upgrade was refused with, or a description of what happened instead. */
const refusal = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.either(effect).pipe(
    Effect.map((r) => (r._tag === "Right" ? "accepted" : r.left instanceof UpgradeRefused ? r.left.status : `failed: ${String(r.left)}`))
  )

const decodeHeartbeat = Schema.decodeUnknownSync(Schema.parseJson(EdgeProtocol.EdgeHeartbeat))

describe("edge", () => {
  it.scopedLive("reports its open sockets in its heartbeat", () =>
    Effect.gen(function*() {
      const ctx = yield* Layer.build(stack(busLayer(), { routes: Echo.routes, services: Echo.layer, env: { EDGE_HEARTBEAT_INTERVAL: "100 millis" } }))
      const edge = Context.get(ctx, Edge.EdgeServer)
      const edges = yield* Context.get(ctx, Kv.Kv).bucket(Subjects.Bucket.edges)
      const reported = edges.get(Subjects.Key.edge(Subjects.EdgeId(edge.id))).pipe(
        Effect.map(Option.map((e) => decodeHeartbeat(new TextDecoder().decode(e.value)).connections))
      )
      const ws = edge.url.replace("http", "ws")
      const reports = (n: number) =>
        reported.pipe(Effect.filterOrFail((r) => Option.getOrUndefined(r) === n), Effect.retry(Schedule.spaced("50 millis")), Effect.timeout("5 seconds"))
      const first = yield* connect(`${ws}/echo`)
      yield* connect(`${ws}/echo`)
      yield* reports(2)
      // And a socket that closed is no longer counted.
      first.ws.close()
      yield* closedWith(first)
      yield* reports(1)
    }))

  it.scopedLive("relays text frames both ways and serves health, readiness and metrics", () =>
    Effect.gen(function*() {
      const { edge, ws } = yield* start()
      const c = yield* connect(`${ws}/echo`)
      c.send({ jsonrpc: "2.0", id: 1, method: "ping" })
      expect(yield* c.next).toEqual({ jsonrpc: "2.0", id: 1, method: "ping" })
      const health = yield* Effect.promise(() => fetch(`${edge.url}/healthz`))
      expect(health.status).toBe(200)
      const ready = yield* Effect.promise(() => fetch(`${edge.url}/readyz`))
      expect(ready.status).toBe(200)
      const metrics = yield* Effect.promise(() => fetch(`${edge.url}/metrics`).then((r) => r.text()))
      expect(metrics).toContain('switchboard_edge_connections{path="/echo"} 1')
      expect(metrics).toMatch(/switchboard_edge_frames_in_total 1\n/)
      expect(metrics).toContain("switchboard_edge_bus_publish_seconds_count 1")
    }))

  it.scopedLive("authenticates before the upgrade: 401 for a bad, expired or missing token", () =>
    Effect.gen(function*() {
      const { ws } = yield* start()
      const good = yield* token({ sub: "alice" })
      const expired = expiredToken("alice")
      const c = yield* connect(`${ws}/v0/ws?topic=t&token=${good}`)
      c.send("hi")
      expect(yield* c.nextText).toBe("hi")
      const byHeader = yield* connect(`${ws}/v0/ws?topic=t`, { headers: { authorization: `Bearer ${good}` } })
      byHeader.send("by header")
      expect(yield* byHeader.nextText).toBe("by header")
      expect(yield* refusal(connect(`${ws}/v0/ws?topic=t`))).toBe(401)
      expect(yield* refusal(connect(`${ws}/v0/ws?topic=t&token=garbage`))).toBe(401)
      expect(yield* refusal(connect(`${ws}/v0/ws?topic=t&token=${expired}`))).toBe(401)
      expect(yield* refusal(connect(`${ws}/v0/ws?topic=t&token=${good.slice(0, -2)}xx`))).toBe(401)
      // `optional` routes take a missing token but not a bad one.
      yield* connect(`${ws}/echo`)
      expect(yield* refusal(connect(`${ws}/echo?token=garbage`))).toBe(401)
      expect(yield* refusal(connect(`${ws}/nowhere`))).toBe(404)
    }))

  it.scopedLive("refuses origins outside the allow-list with 403", () =>
    Effect.gen(function*() {
      const { ws } = yield* start({ env: { ALLOWED_ORIGINS: "https://app.example.com, https://other.example.com" } })
      expect(yield* refusal(connect(`${ws}/echo`, { origin: "https://evil.example.com" }))).toBe(403)
      const ok = yield* connect(`${ws}/echo`, { origin: "https://other.example.com" })
      ok.send("fine")
      expect(yield* ok.nextText).toBe("fine")
    }))

  it.scopedLive("closes 1003 on a binary frame and 1009 on an oversized one, leaving others alone", () =>
    Effect.gen(function*() {
      const { ws } = yield* start({ env: { EDGE_MAX_PAYLOAD: "1024" } })
      const bystander = yield* connect(`${ws}/echo`)
      const binary = yield* connect(`${ws}/echo`)
      binary.ws.send(Buffer.from([1, 2, 3]), { binary: true })
      expect((yield* closedWith(binary)).code).toBe(1003)
      const big = yield* connect(`${ws}/echo`)
      big.send("x".repeat(2048))
      expect((yield* closedWith(big)).code).toBe(1009)
      const fits = yield* connect(`${ws}/echo`)
      fits.send("y".repeat(1000))
      expect((yield* fits.nextText).length).toBe(1000)
      bystander.send("still here")
      expect(yield* bystander.nextText).toBe("still here")
    }))

  it.scopedLive("terminates a socket that stops answering pings", () =>
    Effect.gen(function*() {
      const { edge, ws } = yield* start({ env: { EDGE_PING_INTERVAL: "150 millis" } })
      const healthy = yield* connect(`${ws}/echo`)
      const silent = yield* connect(`${ws}/echo`, { autoPong: false })
      expect((yield* closedWith(silent)).code).toBe(1006)
      healthy.send("alive")
      expect(yield* healthy.nextText).toBe("alive")
      expect(edge.connections()).toBe(1)
    }))

  it.scopedLive("closes a slow consumer with 1013 instead of buffering without limit", () =>
    Effect.gen(function*() {
      const { ws } = yield* start({ env: { EDGE_OUTBOUND_HWM: "65536" } })
      const slow = yield* connect(`${ws}/echo`)
      const fast = yield* connect(`${ws}/echo`)
      // Stop reading: the kernel buffers fill, then the edge's buffer passes the high-water mark.
      const raw = (slow.ws as unknown as { _socket: Net.Socket })._socket
      raw.pause()
      const frame = "z".repeat(60_000)
      // 30 MB of echoes against a reader that has stopped: far more than the kernel's socket
      // buffers hold. Paced so they pile up in the edge; bounded in count.
      for (let i = 0; i < 500; i++) {
        slow.send(frame)
        yield* Effect.sleep("1 millis")
      }
      raw.resume()
      expect((yield* closedWith(slow)).code).toBe(1013)
      fast.send("unaffected")
      expect(yield* fast.nextText).toBe("unaffected")
    }), 30_000)

  it.scopedLive("answers frames over the rate limit with an error, never silently, and closes abusers", () =>
    Effect.gen(function*() {
      const { ws } = yield* start({ env: { EDGE_RATE_LIMIT: "1", EDGE_RATE_BURST: "5" } })
      const c = yield* connect(`${ws}/echo`)
      for (let i = 0; i < 8; i++) c.send({ jsonrpc: "2.0", id: i, method: "m" })
      const answers = yield* Effect.forEach(Array.from({ length: 8 }), () => c.next)
      expect(answers.slice(0, 5)).toEqual([0, 1, 2, 3, 4].map((id) => ({ jsonrpc: "2.0", id, method: "m" })))
      expect(answers.slice(5)).toEqual(
        Array.from({ length: 3 }, () => ({ jsonrpc: "2.0", id: null, error: { code: -32000, message: "Rate limit exceeded" } }))
      )
      for (let i = 0; i < 20; i++) c.send({ jsonrpc: "2.0", id: 100 + i, method: "flood" })
      const closed = yield* closedWith(c)
      expect(closed).toEqual({ code: 1008, reason: "rate limit exceeded" })
    }))

  it.scopedLive("shuts down gracefully: 1001 to open sockets, 503 to new upgrades", () =>
    Effect.gen(function*() {
      const { edge, shutdown, ws } = yield* start()
      const a = yield* connect(`${ws}/echo`)
      const b = yield* connect(`${ws}/echo`)
      const closing = yield* Effect.fork(shutdown)
      expect(yield* closedWith(a)).toEqual({ code: 1001, reason: "server shutting down" })
      expect((yield* closedWith(b)).code).toBe(1001)
      yield* closing.await
      expect(edge.connections()).toBe(0)
      const after = yield* Effect.either(connect(`${ws}/echo`))
      expect(after._tag).toBe("Left")
    }))

  it.scopedLive("relays over NATS to a service on another connection, and closes 1013 when none listens", () =>
    Effect.gen(function*() {
      const { servers } = yield* NatsServer
      const ns = namespace()
      const ctx = yield* Layer.build(stack(busLayer(servers, ns), { routes: Echo.routes }))
      const edge = ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape
      const url = `${edge.url.replace("http", "ws")}/echo`
      const orphan = yield* connect(url)
      expect(yield* closedWith(orphan)).toEqual({ code: 1013, reason: "echo service unavailable" })
      yield* Layer.build(Echo.layer.pipe(Layer.provide(busLayer(servers, ns))))
      const c = yield* connect(url)
      for (let i = 0; i < 100; i++) c.send({ jsonrpc: "2.0", id: i, method: "m" })
      const got = yield* Effect.forEach(Array.from({ length: 100 }), () => c.next)
      expect(got).toEqual(Array.from({ length: 100 }, (_, id) => ({ jsonrpc: "2.0", id, method: "m" })))
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)

  it.scopedLive("delivers one bus message to many of its sockets, and closes a socket on request, fitting a long reason in the frame", () =>
    Effect.gen(function*() {
      // A room-like service: every frame goes to every socket, in one message per edge.
      const members: Array<Actors.Connection> = []
      const room = Layer.scopedDiscard(
        Actors.host({
          service: "broker",
          make: (conn) =>
            Effect.gen(function*() {
              const link = yield* Actors.edgeLink
              members.push(conn)
              return {
                onFrame: (frame: Actors.Frame) =>
                  Effect.sync(() => {
                    if (frame.text === "kick me") return conn.close(4000, "kicked")
                    // 200 bytes of 2-byte characters: more than a close frame holds.
                    if (frame.text === "kick me at length") return conn.close(4001, "é".repeat(100))
                    link.toMany(conn.edge, members.map((m) => m.id)).send(frame.data)
                  })
              }
            })
        })
      )
      const scope = yield* Scope.make()
      const ctx = yield* Layer.buildWithScope(
        stack(busLayer(), { routes: { "/room": { service: "broker", auth: "optional", traceInbound: true } }, services: room }),
        scope
      )
      yield* Effect.addFinalizer(() => Scope.close(scope, Exit.void))
      const edge = ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape
      const bus = ctx.unsafeMap.get(Bus.Bus.key) as Bus.BusShape
      const toEdge = yield* Queue.unbounded<Bus.BusMessage>()
      yield* bus.subscribe(Subjects.edgeOut(edge.id), (m) => void Queue.unsafeOffer(toEdge, m))
      const url = `${edge.url.replace("http", "ws")}/room`
      const [a, b, c] = [yield* connect(url), yield* connect(url), yield* connect(url)]
      a.send("hello all")
      expect([yield* a.nextText, yield* b.nextText, yield* c.nextText]).toEqual(["hello all", "hello all", "hello all"])
      const published = yield* Queue.takeAll(toEdge)
      expect(published.length).toBe(1)
      b.send("kick me")
      expect(yield* closedWith(b)).toEqual({ code: 4000, reason: "kicked" })
      c.send("kick me at length")
      expect(yield* closedWith(c)).toEqual({ code: 4001, reason: `${"é".repeat(60)}...` })
    }))

  it.scopedLive("answers upgrades with 503 while it waits for sockets to close", () =>
    Effect.gen(function*() {
      const { shutdown, ws } = yield* start({ env: { EDGE_SHUTDOWN_GRACE: "3 seconds" } })
      // A peer that stops reading holds the shutdown open until the grace runs out.
      const stubborn = yield* connect(`${ws}/echo`)
      ;(stubborn.ws as unknown as { _socket: Net.Socket })._socket.pause()
      const closing = yield* Effect.fork(shutdown)
      const refused = yield* refusal(connect(`${ws}/echo`)).pipe(
        Effect.filterOrFail((r) => r === 503, (r) => new Error(`still ${r}`)),
        Effect.retry(Schedule.spaced("20 millis")),
        Effect.timeout("2 seconds")
      )
      expect(refused).toBe(503)
      yield* closing.await
    }))
})

describe("edge readiness and access log", () => {
  const readyz = (url: string) => Effect.promise(() => fetch(`${url}/readyz`).then(async (r) => ({ status: r.status, body: (await r.text()).trim() })))

  it.scopedLive("/readyz is 503 while no service behind the edge runs, and says which are missing", () =>
    Effect.gen(function*() {
      const alone = Context.get(yield* Layer.build(stack(busLayer())), Edge.EdgeServer)
      expect(yield* readyz(alone.url)).toEqual({ status: 503, body: "not ready: no live replica of router, broker, registry, so every upgrade would be refused" })
      const some = Context.get(yield* Layer.build(stack(busLayer(), { services: Router.layer })), Edge.EdgeServer)
      expect(yield* readyz(some.url)).toEqual({ status: 200, body: "ready, but no live replica of broker, registry" })
      const all = Context.get(yield* Layer.build(stack(busLayer(), { services: Layer.mergeAll(Router.layer, Broker.layer, Registry.layer) })), Edge.EdgeServer)
      expect(yield* readyz(all.url)).toEqual({ status: 200, body: "ready" })
    }))

  it.scopedLive("logs refused upgrades and closes at info, upgrades at debug, without the token", () =>
    Effect.gen(function*() {
      const proc = yield* Processes.allInOne({ namespace: namespace(), env: { LOG_LEVEL: "debug" } })
      const t = yield* token({ sub: "alice" })
      const refused = yield* Effect.either(connect(`${proc.ws}/tabs?token=not-a-token`))
      expect(refused._tag === "Left" && refused.left instanceof UpgradeRefused ? refused.left.status : refused._tag).toBe(401)
      const tab = yield* connect(`${proc.ws}/tabs?token=${t}`)
      tab.send({ jsonrpc: "2.0", id: 1, method: "ping" })
      yield* tab.next
      tab.ws.close(1000, "bye")
      yield* closedWith(tab)
      const lines = yield* Effect.suspend(() => {
        const out = proc.output().split("\n").filter((l) => /message="edge: (opened|closed|refused)/.test(l))
        return out.length >= 3 ? Effect.succeed(out) : Effect.fail("not yet")
      }).pipe(Effect.retry(Schedule.spaced("50 millis")), Effect.timeout("5 seconds"), Effect.orDie)
      const [refusedLine, opened, closed] = lines
      expect(refusedLine).toMatch(/level=INFO .*message="edge: refused an upgrade with 401: invalid token: .*url="\/tabs\?token=…"/)
      /** The line's `key=value` annotations. */
      const fields = (line: string | undefined) => Object.fromEntries([...(line ?? "").matchAll(/ (\w+)=([^"\s]\S*)/g)].map((m) => [m[1], m[2]]))
      expect(opened).toMatch(/level=DEBUG .*message="edge: opened \/tabs with 101"/)
      expect(fields(opened)).toMatchObject({ path: "/tabs", remote: "127.0.0.1", user: "alice", conn: expect.stringMatching(/^[0-9a-f-]{36}$/) })
      // The close line says all the upgrade line did, so that info alone still tells who was connected.
      expect(closed).toMatch(/level=INFO .*message="edge: closed \/tabs with 1000: bye"/)
      expect(fields(closed)).toMatchObject({
        conn: fields(opened)["conn"],
        path: "/tabs",
        remote: "127.0.0.1",
        user: "alice",
        framesIn: "1",
        framesOut: "1",
        ms: expect.stringMatching(/^\d+$/)
      })
      expect(proc.output()).not.toContain("not-a-token")
      expect(proc.output()).not.toContain(t)
    }), 60_000)
})

