/**
 * The MCP Proxy Protocol under attack, one group per attack (issue 12, "Hardening first"): forged
 * replies from extensions that don't own the connection, a socket switched to another user,
 * sockets held open without authenticating or by the thousand, and frames nested thousands deep.
 * Each test failed on the router before its fix.
 */
import { describe, expect, it } from "@effect/vitest"
import { Actors, Kv, Subjects } from "@switchboard/bus"
import { Edge } from "@switchboard/edge"
import { Router } from "@switchboard/router"
import { NatsServer } from "@switchboard/testing"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import { closedWith, connect } from "./support/Client.ts"
import { attach, call, client, connected, extensionOf, handled, next } from "./support/ProxyPeers.ts"
import { busLayer, namespace, replica, serve, stack, token } from "./support/Stack.ts"

const start = (env: Record<string, string> = {}) => Effect.map(serve(Router.layer, env), (s) => s.ws)

/** A request whose params nest `depth` objects deep: JSON.parse copes, what recurses after it does not. */
const nested = (depth: number, id: number | string = 1) =>
  `{"jsonrpc":"2.0","id":${JSON.stringify(id)},"method":"createTab","params":${"{\"a\":".repeat(depth)}1${"}".repeat(depth)}}`

const PARSE_ERROR = { jsonrpc: "2.0", id: null, error: { code: -32700, message: "Parse error: JSON nested deeper than 64 levels" } }

describe("forged replies", () => {
  it.scopedLive("only the extension a connection is attached to can answer for it; another user's or an unattached one's reply is dropped", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const { connectionId, ext, mcp } = yield* connected(ws)
      const bobs = yield* extensionOf(ws, "bob")
      const alicesOther = yield* extensionOf(ws, "alice", "Firefox")
      for (const [forger, id] of [[bobs, 10], [alicesOther, 11]] as const) {
        mcp.send({ jsonrpc: "2.0", id, method: "getTabs" })
        const forwarded = yield* next(ext.c)
        expect(forwarded.id).toBe(`${connectionId}:${id}`)
        // The forgery goes first, and has been handled before the genuine answer is sent.
        forger.c.send({ jsonrpc: "2.0", id: forwarded.id, result: { forged: true } })
        yield* handled(forger.c)
        ext.c.send({ jsonrpc: "2.0", id: forwarded.id, result: { genuine: true } })
        expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id, result: { genuine: true } })
      }
      // Nothing stray arrived in between: the next message is the answer to the next request.
      mcp.send({ jsonrpc: "2.0", id: 12, method: "getTabs" })
      const last = yield* next(ext.c)
      ext.c.send({ jsonrpc: "2.0", id: last.id, result: { last: true } })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 12, result: { last: true } })
      // Ids that name no connection the router minted go nowhere, and the forgers keep working.
      for (const bogus of ["conn-*:1", "nonsense", `${connectionId}.>:1`]) bobs.c.send({ jsonrpc: "2.0", id: bogus, result: {} })
      yield* handled(bobs.c)
      const bob = yield* client(ws, "bob")
      yield* attach(bob, bobs.id)
      bob.send({ jsonrpc: "2.0", id: 1, method: "getTabs" })
      const bobsOwn = yield* next(bobs.c)
      bobs.c.send({ jsonrpc: "2.0", id: bobsOwn.id, result: { bob: true } })
      expect(yield* next(bob)).toEqual({ jsonrpc: "2.0", id: 1, result: { bob: true } })
    }))

  it.scopedLive("an extension that sends a request whose method is not a string gets -32600 and keeps serving", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const { ext, mcp } = yield* connected(ws)
      // String() of this object throws; the router used to throw with it and answer nothing.
      ext.c.send({ jsonrpc: "2.0", id: 5, method: { toString: 1 } })
      expect(yield* next(ext.c)).toMatchObject({ jsonrpc: "2.0", id: 5, error: { code: -32600 } })
      mcp.send({ jsonrpc: "2.0", id: 1, method: "getTabs" })
      const forwarded = yield* next(ext.c)
      ext.c.send({ jsonrpc: "2.0", id: forwarded.id, result: [] })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 1, result: [] })
    }))
})

describe("a second mcp_handshake", () => {
  it.scopedLive("is refused with -32001 and leaves the socket its first user's", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const alices = yield* extensionOf(ws, "alice")
      yield* extensionOf(ws, "bob")
      const mcp = yield* client(ws, "alice")
      expect(yield* call(mcp, 2, "mcp_handshake", { accessToken: yield* token({ sub: "bob" }) })).toEqual({
        jsonrpc: "2.0",
        id: 2,
        error: { code: -32001, message: "MCP client already authenticated" }
      })
      // The same user's token again is no different.
      expect((yield* call(mcp, 3, "mcp_handshake", { access_token: yield* token({ sub: "alice" }) })).error).toEqual({
        code: -32001,
        message: "MCP client already authenticated"
      })
      expect((yield* call(mcp, 4, "list_extensions")).result).toEqual({ extensions: [{ id: alices.id, name: "Chrome 141", connected: true }] })
    }))
})

describe("sockets held open", () => {
  it.scopedLive("an /mcp socket that does not complete mcp_handshake in time is closed with 1008; failed attempts don't extend it", () =>
    Effect.gen(function*() {
      const ws = yield* start({ ROUTER_AUTH_TIMEOUT: "500 millis" })
      const alice = yield* client(ws, "alice")
      const silent = yield* connect(`${ws}/mcp`)
      expect(yield* closedWith(silent)).toEqual({ code: 1008, reason: "Authentication failed: no mcp_handshake in time" })
      // A socket that keeps trying with bad tokens, more often than the deadline, is closed all the same.
      const persistent = yield* connect(`${ws}/mcp`)
      yield* call(persistent, 1, "mcp_handshake", { accessToken: "garbage" }).pipe(
        Effect.tap((m) => expect(m.error).toMatchObject({ code: -32000 })),
        Effect.repeat(Schedule.spaced("100 millis")),
        Effect.forkScoped
      )
      expect(yield* closedWith(persistent)).toEqual({ code: 1008, reason: "Authentication failed: no mcp_handshake in time" })
      // Alice's socket opened before both and is past its deadline too, but she had authenticated.
      expect(yield* Deferred.poll(alice.closed)).toEqual(Option.none())
      expect((yield* call(alice, 2, "list_extensions")).result).toEqual({ extensions: [] })
    }))

  it.scopedLive("caps the MCP clients and extensions of one user, and a seat comes free when one goes", () =>
    Effect.gen(function*() {
      const ws = yield* start({ ROUTER_MAX_CLIENTS_PER_USER: "2", ROUTER_MAX_EXTENSIONS_PER_USER: "1" })
      const aliceToken = yield* token({ sub: "alice" })
      const first = yield* client(ws, "alice")
      yield* client(ws, "alice")
      const third = yield* connect(`${ws}/mcp`)
      expect(yield* call(third, 1, "mcp_handshake", { accessToken: aliceToken })).toEqual({
        jsonrpc: "2.0",
        id: 1,
        error: { code: -32000, message: "Too many connections for this user (limit 2 MCP clients)" }
      })
      expect((yield* call(third, 2, "list_extensions")).error).toEqual({ code: -32000, message: "Not authenticated: send mcp_handshake first" })
      // Per user: Bob is not affected.
      yield* client(ws, "bob")
      first.ws.close()
      yield* closedWith(first)
      // The router hears of the close just after the client does.
      const admitted = yield* call(third, 3, "mcp_handshake", { accessToken: aliceToken }).pipe(
        Effect.filterOrFail((m) => "result" in m),
        Effect.retry(Schedule.spaced("50 millis")),
        Effect.timeout("5 seconds")
      )
      expect(admitted.result).toMatchObject({ authenticated: true, user_id: "alice" })

      yield* extensionOf(ws, "alice")
      const extra = yield* connect(`${ws}/extension`)
      yield* next(extra)
      extra.send({ jsonrpc: "2.0", id: "proxy:1", result: { name: "Firefox", accessToken: aliceToken } })
      expect(yield* closedWith(extra)).toEqual({ code: 1008, reason: "Too many connections for this user (limit 1 extensions)" })
      yield* extensionOf(ws, "bob")
    }))

  it.live("a replica that adopts an authenticated client gives it no handshake deadline", () =>
    Effect.gen(function*() {
      const env = { ROUTER_REPLICA_HEARTBEAT: "200 millis", ROUTER_AUTH_TIMEOUT: "1 second" }
      const { servers } = yield* NatsServer
      const ns = namespace()
      const ctx = yield* Layer.build(stack(busLayer(servers, ns), { env }))
      const edge = ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape
      const ws = edge.url.replace("http", "ws")
      const first = yield* replica(Router.layer, servers, ns, env)
      yield* Effect.addFinalizer(() => first.stop)
      const { connectionId, ext, mcp } = yield* connected(ws)
      const second = yield* replica(Router.layer, servers, ns, env)
      yield* Effect.addFinalizer(() => second.stop)

      // The first replica, holding both sockets, stops; wait until the second owns them.
      yield* first.stop
      const kv = ctx.unsafeMap.get(Kv.Kv.key) as Kv.KvShape
      yield* Kv.typed(yield* kv.bucket(Subjects.Bucket.connections), Actors.ConnectionRecord).values().pipe(
        Effect.filterOrFail((records) => new Set(records.map((r) => r.value.replica)).size === 1),
        Effect.retry(Schedule.spaced("50 millis")),
        Effect.timeout("10 seconds")
      )
      // A socket opened after the adoption is closed at its deadline, so the adopted client's
      // would have passed too.
      const late = yield* connect(`${ws}/mcp`)
      expect((yield* closedWith(late)).code).toBe(1008)
      expect(yield* Deferred.poll(mcp.closed)).toEqual(Option.none())
      mcp.send({ jsonrpc: "2.0", id: 9, method: "getTabs" })
      const forwarded = yield* next(ext.c)
      expect(forwarded.id).toBe(`${connectionId}:9`)
      ext.c.send({ jsonrpc: "2.0", id: forwarded.id, result: { adopted: true } })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 9, result: { adopted: true } })
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)
})

describe("frames nested thousands deep", () => {
  it.scopedLive("on /mcp, before and after connect, are answered at once with -32700 and the socket keeps working", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const ext = yield* extensionOf(ws, "alice")
      const mcp = yield* client(ws, "alice")
      mcp.send(nested(6_000))
      expect(yield* next(mcp)).toEqual(PARSE_ERROR)
      yield* attach(mcp, ext.id)
      mcp.send(nested(6_000, 2))
      expect(yield* next(mcp)).toEqual(PARSE_ERROR)
      // Within the limit, it goes through.
      mcp.send(nested(60, 3))
      const forwarded = yield* next(ext.c)
      expect(forwarded.id).toMatch(/:3$/)
      ext.c.send({ jsonrpc: "2.0", id: forwarded.id, result: { ok: true } })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 3, result: { ok: true } })
    }))

  it.scopedLive("from an extension, even as the answer to a pending request, get -32700 and its later replies still reach the client", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const { ext, mcp } = yield* connected(ws)
      ext.c.send(nested(6_000, "proxy:1"))
      expect(yield* next(ext.c)).toEqual(PARSE_ERROR)
      mcp.send({ jsonrpc: "2.0", id: 4, method: "getTabs" })
      const forwarded = yield* next(ext.c)
      ext.c.send(`{"jsonrpc":"2.0","id":${JSON.stringify(forwarded.id)},"result":${"[".repeat(6_000)}${"]".repeat(6_000)}}`)
      expect(yield* next(ext.c)).toEqual(PARSE_ERROR)
      ext.c.send({ jsonrpc: "2.0", id: forwarded.id, result: { tabs: [] } })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 4, result: { tabs: [] } })
    }))
})
