/**
 * Router replicas share the work and survive each other: over NATS, two replicas on their own
 * connections; the one holding a live session stops mid-session and the other adopts its sockets
 * from KV, so the same client keeps talking to the same extension.
 */
import { describe, expect, it } from "@effect/vitest"
import { Actors, Kv, Subjects } from "@switchboard/bus"
import { Edge } from "@switchboard/edge"
import { Router } from "@switchboard/router"
import { NatsServer } from "@switchboard/testing"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import { connect } from "./support/Client.ts"
import { call, type Message, next } from "./support/ProxyPeers.ts"
import { busLayer, namespace, natsEdge, replica, stack, token } from "./support/Stack.ts"

const env = { ROUTER_REPLICA_HEARTBEAT: "200 millis" }

describe("router replicas", () => {
  it.scopedLive("share new connections, and a stopped replica's sessions carry on at the other", () =>
    Effect.gen(function*() {
      const { servers } = yield* NatsServer
      const ns = namespace()
      const ctx = yield* Layer.build(stack(busLayer(servers, ns), { env }))
      const edge = ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape
      const ws = edge.url.replace("http", "ws")
      const start = replica(Router.layer, servers, ns, env)

      const first = yield* start
      const t = yield* token({ sub: "alice" })
      const ext = yield* connect(`${ws}/extension`)
      yield* next(ext)
      ext.send({ jsonrpc: "2.0", id: "proxy:1", result: { name: "Chrome", accessToken: t } })
      const extensionId = (yield* next(ext)).params!["extension_id"]
      const mcp = yield* connect(`${ws}/mcp`)
      yield* call(mcp, 1, "mcp_handshake", { accessToken: t })
      const connectionId = ((yield* call(mcp, 2, "connect", { extension_id: extensionId })).result as Message)["connection_id"]
      mcp.send({ jsonrpc: "2.0", id: 3, method: "getTabs" })
      const before = yield* next(ext)
      ext.send({ jsonrpc: "2.0", id: before.id, result: { replica: "first" } })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 3, result: { replica: "first" } })

      // A second replica joins: new sockets are spread over both.
      yield* start
      const others = yield* Effect.forEach(Array.from({ length: 12 }), () => connect(`${ws}/mcp`))
      yield* Effect.forEach(others, (c, i) => call(c, i, "mcp_handshake", { accessToken: t }))
      const kv = ctx.unsafeMap.get(Kv.Kv.key) as Kv.KvShape
      const owners = Kv.typed(yield* kv.bucket(Subjects.Bucket.connections), Actors.ConnectionRecord)
        .values()
        .pipe(Effect.map((records) => new Set(records.map((r) => r.value.replica)).size), Effect.orDie)
      expect(yield* owners).toBe(2)

      // The first replica, which holds the live session, stops. Frames sent before the other has
      // adopted its sockets are lost (their requests time out), so wait for the adoption.
      yield* first.stop
      yield* owners.pipe(
        Effect.filterOrFail((n) => n === 1, () => new Error("not adopted yet")),
        Effect.retry(Schedule.spaced("50 millis")),
        Effect.timeout("10 seconds")
      )
      mcp.send({ jsonrpc: "2.0", id: 4, method: "getTabs" })
      const after = yield* next(ext)
      expect(after.id).toBe(`${connectionId}:4`)
      ext.send({ jsonrpc: "2.0", id: after.id, result: { replica: "second" } })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 4, result: { replica: "second" } })
      expect((yield* call(mcp, 5, "list_extensions")).result).toEqual({ extensions: [{ id: extensionId, name: "Chrome", connected: true }] })
      // And the extension going away still reaches the adopted client.
      ext.ws.close()
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", method: "disconnected", params: { connection_id: connectionId, reason: "Extension closed" } })
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)
})

describe("router replicas whose heartbeat lapsed", () => {
  it.scopedLive("a replica whose key lapsed in KV but still runs keeps its sockets: the other does not adopt them", () =>
    Effect.gen(function*() {
      const { servers, ns, ctx, ws } = yield* natsEdge(env)
      const kv = ctx.unsafeMap.get(Kv.Kv.key) as Kv.KvShape
      const replicas = yield* kv.bucket(Subjects.Bucket.replicas)
      const owners = Kv.typed(yield* kv.bucket(Subjects.Bucket.connections), Actors.ConnectionRecord).values().pipe(
        Effect.map((records) => new Set(records.map((r) => r.value.replica))),
        Effect.orDie
      )
      // The first renews its key slowly, the second sweeps for lapsed replicas every 100 ms.
      yield* replica(Router.layer, servers, ns, { ROUTER_REPLICA_HEARTBEAT: "2900 millis" })
      const t = yield* token({ sub: "alice" })
      const ext = yield* connect(`${ws}/extension`)
      yield* next(ext)
      ext.send({ jsonrpc: "2.0", id: "proxy:1", result: { name: "Chrome", accessToken: t } })
      const extensionId = (yield* next(ext)).params!["extension_id"]
      const mcp = yield* connect(`${ws}/mcp`)
      yield* call(mcp, 1, "mcp_handshake", { accessToken: t })
      const connectionId = ((yield* call(mcp, 2, "connect", { extension_id: extensionId })).result as Message)["connection_id"]
      const [first] = [...(yield* owners)]
      if (first === undefined) return yield* Effect.dieMessage("no connection records")
      yield* replica(Router.layer, servers, ns, { ROUTER_REPLICA_HEARTBEAT: "100 millis" })

      // As when its heartbeat writes failed through a NATS election: its key is gone, it is not.
      const key = Subjects.Key.replica("router", first)
      yield* replicas.delete(key).pipe(Effect.orDie)
      // Until it renews the key (within 2.9 s) the second replica sweeps some 29 times.
      yield* replicas.get(key).pipe(
        Effect.orDie,
        Effect.filterOrFail((found) => found._tag === "Some"),
        Effect.retry(Schedule.spaced("50 millis").pipe(Schedule.upTo("10 seconds"))),
        Effect.orDieWith(() => new Error("the first replica did not renew its key"))
      )
      expect([...(yield* owners)]).toEqual([first])
      // One actor per socket still: every request reaches the extension, in order, and is answered.
      for (let i = 0; i < 20; i++) mcp.send({ jsonrpc: "2.0", id: 100 + i, method: "getTabs" })
      for (let i = 0; i < 20; i++) {
        const got = yield* next(ext)
        expect(got.id).toBe(`${connectionId}:${100 + i}`)
        ext.send({ jsonrpc: "2.0", id: got.id, result: { tabs: [] } })
      }
      for (let i = 0; i < 20; i++) expect((yield* next(mcp)).id).toBe(100 + i)
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)
})
