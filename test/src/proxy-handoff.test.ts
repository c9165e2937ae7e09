/**
 * A router replica that stops (SIGTERM: its scope closes) hands its sockets to the other replica
 * under steady traffic: over NATS, an MCP client keeps 50 requests in flight to an extension while
 * the replica that owns both sockets stops. Every request must get its own answer, none may be
 * lost, and the extension must see every request once, in the order the client sent them.
 */
import { describe, expect, it } from "@effect/vitest"
import { Actors, Bus, Kv, Subjects } from "@switchboard/bus"
import { Edge } from "@switchboard/edge"
import { Router } from "@switchboard/router"
import { NatsServer } from "@switchboard/testing"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { connect, type TestClient } from "./support/Client.ts"
import * as Processes from "./support/Processes.ts"
import { call, type Message, next } from "./support/ProxyPeers.ts"
import { busLayer, namespace, natsEdge, replica, stack, token } from "./support/Stack.ts"
import { throughStop } from "./support/Traffic.ts"
import { until } from "./support/Until.ts"

// A slow heartbeat: survivors would adopt the stopped replica's sockets from KV only ~18 s after
// it stopped, long after this test has judged the hand-off.
const env = { ROUTER_REPLICA_HEARTBEAT: "3 seconds" }
const IN_FLIGHT = 50

/** An extension and an MCP client of one user, connected to each other through the router. */
const connectedPair = (ws: string) =>
  Effect.gen(function*() {
    const t = yield* token({ sub: "alice" })
    const ext = yield* connect(`${ws}/extension`)
    yield* next(ext)
    ext.send({ jsonrpc: "2.0", id: "proxy:1", result: { name: "Chrome", accessToken: t } })
    const extensionId = (yield* next(ext)).params!["extension_id"]
    const mcp = yield* connect(`${ws}/mcp`)
    yield* call(mcp, 0, "mcp_handshake", { accessToken: t })
    const connectionId = ((yield* call(mcp, 0.5, "connect", { extension_id: extensionId })).result as Message)["connection_id"] as string
    return { ext, mcp, connectionId }
  })

/**
 * Steady traffic from `mcp` to `ext` while `stop` runs: every request must get exactly one answer,
 * its own, and the extension must see each once, in the order the client sent them.
 */
const underTraffic = (ext: TestClient, mcp: TestClient, connectionId: string, stop: Effect.Effect<void>) =>
  Effect.gen(function*() {
    const { errors, lost, seen, sent, stopMillis, wrong } = yield* throughStop({
      inFlight: IN_FLIGHT,
      send: (n) => mcp.send({ jsonrpc: "2.0", id: n, method: "getTabs", params: { n } }),
      received: Effect.map(next(ext), (got) => got.id as string),
      // The extension answers each request with its own id.
      answer: (mapped) => ext.send({ jsonrpc: "2.0", id: mapped, result: { echo: mapped } }),
      reply: next(mcp),
      isOwn: (n, m) => (m.result as Message)["echo"] === `${connectionId}:${n}`
    }, stop)
    expect({ lost, wrong, errors }).toEqual({ lost: 0, wrong: 0, errors: 0 })
    // The extension saw every request once, in the client's order.
    expect(seen).toEqual(Array.from({ length: sent }, (_, i) => `${connectionId}:${i + 1}`))
    return { sent, stopMillis }
  })

describe("router hand-off", () => {
  it.scopedLive("a stopping replica hands its sockets over under traffic: no request lost, none answered wrong, frames in order", () =>
    Effect.gen(function*() {
      const { servers } = yield* NatsServer
      const ns = namespace()
      const ctx = yield* Layer.build(stack(busLayer(servers, ns), { env }))
      const edge = ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape
      const ws = edge.url.replace("http", "ws")
      const start = replica(Router.layer, servers, ns, env)

      const first = yield* start
      const { ext, mcp, connectionId } = yield* connectedPair(ws)
      yield* start
      const kv = ctx.unsafeMap.get(Kv.Kv.key) as Kv.KvShape
      const owners = Kv.typed(yield* kv.bucket(Subjects.Bucket.connections), Actors.ConnectionRecord)
        .values()
        .pipe(Effect.map((records) => new Set(records.map((r) => r.value.replica))), Effect.orDie)
      const before = yield* owners
      expect(before.size).toBe(1)

      console.log(`hand-off under traffic: ${JSON.stringify(yield* underTraffic(ext, mcp, connectionId, first.stop))}`)
      // Both sockets now belong to the other replica, and still talk.
      const now = yield* owners
      expect(now.size).toBe(1)
      expect([...now][0]).not.toBe([...before][0])
      mcp.send({ jsonrpc: "2.0", id: "last", method: "getTabs" })
      const last = yield* next(ext)
      expect(last.id).toBe(`${connectionId}:last`)
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)

  it.scopedLive("a router process that gets SIGTERM hands its sockets over before it exits, under traffic", () =>
    Effect.gen(function*() {
      const { servers } = yield* NatsServer
      const natsUrl = servers.join(",")
      const d = yield* Processes.deployment(natsUrl, { edges: 1, env })
      // Both sockets go to the only router there is yet.
      const { ext, mcp, connectionId } = yield* connectedPair(d.edges[0]!.ws)
      const second = yield* Processes.router({ natsUrl, namespace: d.namespace, env })
      yield* until(() => second.output().includes("hosting connection actors"), "the second router hosting actors", "50 millis")

      const stop = Effect.zipRight(d.router.kill("SIGTERM"), d.router.exited)
      console.log(`SIGTERM under traffic: ${JSON.stringify(yield* underTraffic(ext, mcp, connectionId, stop))}`)
      expect(yield* d.router.exited).toEqual({ code: 0, signal: null })
      expect(d.router.output()).toContain("handed 2 connections over to other replicas")
      // Handed over, not adopted from KV after the heartbeat lapsed.
      expect(second.output()).not.toContain("adopted")
      mcp.send({ jsonrpc: "2.0", id: "last", method: "getTabs" })
      expect((yield* next(ext)).id).toBe(`${connectionId}:last`)
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 90_000)
})

describe("router hand-off to a replica still starting", () => {
  it.scopedLive("a replica stopped while the one replacing it still starts waits for it, and hands every socket to it", () =>
    Effect.gen(function*() {
      const { servers, ns, ctx, ws } = yield* natsEdge(env)
      const kv = ctx.unsafeMap.get(Kv.Kv.key) as Kv.KvShape
      const owners = Kv.typed(yield* kv.bucket(Subjects.Bucket.connections), Actors.ConnectionRecord).values().pipe(
        Effect.map((rs) => rs.map((r) => r.value.replica)),
        Effect.orDie
      )
      const first = yield* replica(Router.layer, servers, ns, env)
      const pairs = yield* Effect.forEach([1, 2, 3], () => connectedPair(ws))
      const lone = yield* connect(`${ws}/mcp`)
      yield* call(lone, 0, "mcp_handshake", { accessToken: yield* token({ sub: "bob" }) })
      const before = yield* owners
      expect(before.length).toBe(7)
      expect(new Set(before).size).toBe(1)

      // Another replica's key is in KV, but nobody answers hand-offs yet: as on a NATS cluster,
      // where the new replica's interest reaches the stopping one's node a moment after its key.
      const replicas = yield* kv.bucket(Subjects.Bucket.replicas)
      yield* replicas.put(Subjects.Key.replica("router", "on-its-way"), String(Date.now())).pipe(Effect.orDie)
      yield* Effect.all([first.stop, replica(Router.layer, servers, ns, env)], { concurrency: 2, discard: true })
      // Handed over, every one: adopted from KV instead, they would still name the stopped replica
      // for a heartbeat or more (3 s here).
      const after = yield* owners
      expect(after.length).toBe(7)
      expect(after.filter((r) => r === before[0])).toEqual([])
      expect(new Set(after).size).toBe(1)
      for (const [i, { connectionId, ext, mcp }] of pairs.entries()) {
        mcp.send({ jsonrpc: "2.0", id: `after-${i}`, method: "getTabs" })
        expect((yield* next(ext)).id).toBe(`${connectionId}:after-${i}`)
      }
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)
})

describe("router hand-off with an actor whose socket is gone", () => {
  it.scopedLive("an actor whose socket its edge no longer knows holds the stop for the marker's timeout only; the others are handed over", () =>
    Effect.gen(function*() {
      const { servers, ns, ctx, ws } = yield* natsEdge(env)
      const bus = ctx.unsafeMap.get(Bus.Bus.key) as Bus.BusShape
      const kv = ctx.unsafeMap.get(Kv.Kv.key) as Kv.KvShape
      const records = Kv.typed(yield* kv.bucket(Subjects.Bucket.connections), Actors.ConnectionRecord)
      const first = yield* replica(Router.layer, servers, ns, env)
      const { connectionId, ext, mcp } = yield* connectedPair(ws)
      const [real] = yield* records.values().pipe(Effect.orDie)
      if (real === undefined) return yield* Effect.dieMessage("no connection record")
      // As when the edge gave up on an open (5 s) that the service answered later: an actor for a
      // socket the edge does not know, whose close will never come.
      const ghost = Subjects.ConnId("ghost-socket")
      // Fails the test unless the router took it.
      yield* Actors.requestOpen(bus, "router", ghost, Subjects.EdgeId(real.value.edge), real.value.open, "5 seconds").pipe(Effect.orDie)
      yield* replica(Router.layer, servers, ns, env)

      const startedAt = performance.now()
      yield* first.stop
      const stopMillis = performance.now() - startedAt
      console.log(`stop with a ghost actor: ${stopMillis.toFixed(0)} ms`)
      // The ghost's hand-off waited for its marker (3 s), and no longer: not the whole grace (10 s).
      expect(stopMillis).toBeGreaterThanOrEqual(3_000)
      expect(stopMillis).toBeLessThan(6_000)
      const owners = new Map((yield* records.values().pipe(Effect.orDie)).map((r) => [r.key, r.value.replica]))
      const survivors = new Set([...owners].filter(([conn]) => conn !== ghost).map(([, owner]) => owner))
      expect(survivors.size).toBe(1)
      expect(survivors.has(real.value.replica)).toBe(false)
      // Not handed over, the ghost's record still names the stopped replica, unless the survivor
      // has already adopted it from KV: its sweep may, once the stopped replica's key is gone.
      expect([real.value.replica, ...survivors]).toContain(owners.get(ghost))
      mcp.send({ jsonrpc: "2.0", id: "after", method: "getTabs" })
      expect((yield* next(ext)).id).toBe(`${connectionId}:after`)
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)
})
