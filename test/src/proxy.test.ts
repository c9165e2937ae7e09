/**
 * The MCP Proxy Protocol over real sockets (embedded bus): every example exchange of the spec, the
 * error codes, id mapping, isolation, lifecycle, timeouts and limits. The same router runs across
 * NATS and processes in proxy-distributed.test.ts.
 */
import { describe, expect, it } from "@effect/vitest"
import { Router } from "@switchboard/router"
import * as Effect from "effect/Effect"
import { closedWith, connect } from "./support/Client.ts"
import { call, client, connected, echoing, extension, type Message, next, nextStatus } from "./support/ProxyPeers.ts"
import { expiredToken, serve, token } from "./support/Stack.ts"

const start = (env: Record<string, string> = {}) => Effect.map(serve(Router.layer, env), (s) => s.ws)

describe("MCP proxy protocol", () => {
  it.scopedLive("runs the spec's exchanges: authenticate, handshake, list, connect, forward, errors, disconnect", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const aliceToken = yield* token({ sub: "83898119-db4f-4848-9d27-ea328b73a4df" })
      const ext = yield* extension(ws, { name: "Chrome 141", accessToken: aliceToken })
      expect(ext.userId).toBe("83898119-db4f-4848-9d27-ea328b73a4df")
      expect(ext.id).toMatch(/^ext-[0-9a-f-]{36}$/)

      const mcp = yield* connect(`${ws}/mcp`)
      const hello = yield* call(mcp, 1, "mcp_handshake", { accessToken: aliceToken })
      expect(hello).toEqual({
        jsonrpc: "2.0",
        id: 1,
        result: { authenticated: true, user_id: "83898119-db4f-4848-9d27-ea328b73a4df", mcp_client_id: expect.stringMatching(/^mcp-[0-9a-f-]{36}$/) }
      })
      expect(yield* call(mcp, 2, "list_extensions")).toEqual({
        jsonrpc: "2.0",
        id: 2,
        result: { extensions: [{ id: ext.id, name: "Chrome 141", connected: true }] }
      })
      const conn = yield* call(mcp, 3, "connect", { extension_id: ext.id })
      expect(conn).toEqual({
        jsonrpc: "2.0",
        id: 3,
        result: { connection_id: expect.stringMatching(/^conn-[0-9a-f-]{36}$/), extension_id: ext.id, extension_name: "Chrome 141" }
      })
      const connectionId = (conn.result as Message)["connection_id"] as string

      // 5.1–5.4: the optional connectionId is stripped, the id mapped and restored.
      mcp.send({ jsonrpc: "2.0", id: 100, method: "createTab", params: { url: "https://example.com", stealth: true }, connectionId })
      const forwarded = yield* next(ext.c)
      expect(forwarded).toEqual({ jsonrpc: "2.0", id: `${connectionId}:100`, method: "createTab", params: { url: "https://example.com", stealth: true } })
      ext.c.send({ jsonrpc: "2.0", id: forwarded.id, result: { tabId: 42, url: "https://example.com" } })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 100, result: { tabId: 42, url: "https://example.com" } })

      // An extension's error passes through unchanged.
      mcp.send({ jsonrpc: "2.0", id: 101, method: "createTab", params: { url: "chrome://settings" } })
      const refused = yield* next(ext.c)
      ext.c.send({ jsonrpc: "2.0", id: refused.id, error: { code: -32000, message: "Tab creation failed: Permission denied" } })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 101, error: { code: -32000, message: "Tab creation failed: Permission denied" } })

      // A UUID id stays a string; an empty result is valid.
      const uuid = "550e8400-e29b-41d4-a716-446655440000"
      mcp.send({ jsonrpc: "2.0", id: uuid, method: "getTabs", params: {} })
      const byUuid = yield* next(ext.c)
      expect(byUuid.id).toBe(`${connectionId}:${uuid}`)
      ext.c.send({ jsonrpc: "2.0", id: byUuid.id, result: {} })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: uuid, result: {} })

      // A numeric-looking string id stays a string.
      mcp.send({ jsonrpc: "2.0", id: "7", method: "getTabs" })
      const stringSeven = yield* next(ext.c)
      ext.c.send({ jsonrpc: "2.0", id: stringSeven.id, result: { ok: true } })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: "7", result: { ok: true } })

      expect(yield* call(mcp, 4, "disconnect")).toEqual({ jsonrpc: "2.0", id: 4, result: { disconnected: true } })
      expect(yield* call(mcp, 5, "disconnect")).toEqual({ jsonrpc: "2.0", id: 5, result: { disconnected: true } })
      expect(yield* call(mcp, 6, "createTab")).toEqual({ jsonrpc: "2.0", id: 6, error: { code: -32000, message: "Not connected to an extension" } })
    }))

  it.scopedLive("sends status notices to both sides on change and as a keepalive", () =>
    Effect.gen(function*() {
      const ws = yield* start({ ROUTER_STATUS_INTERVAL: "200 millis" })
      const ext = yield* extension(ws, { name: "Chrome", accessToken: yield* token({ sub: "alice" }) })
      const first = yield* nextStatus(ext.c)
      expect(first.params).toEqual({ connected: true, peer_count: 0, timestamp: expect.any(String) })
      const mcp = yield* client(ws, "alice")
      yield* call(mcp, 2, "connect", { extension_id: ext.id })
      expect((yield* nextStatus(mcp)).params).toMatchObject({ connected: true, peer_count: 1 })
      // Keepalives keep coming, on both sides.
      yield* nextStatus(ext.c)
      yield* nextStatus(ext.c)
      expect(new Date((yield* nextStatus(mcp)).params!["timestamp"] as string).getTime()).toBeGreaterThan(0)
    }))

  it.scopedLive("accepts access_token and client_id; a browser keeps its id and its newest socket wins", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const t = yield* token({ sub: "alice" })
      const first = yield* extension(ws, { name: "Chrome", access_token: t, client_id: "browser-1" })
      const second = yield* extension(ws, { name: "Chrome", access_token: t, client_id: "browser-1" })
      expect(second.id).toBe(first.id)
      expect(yield* closedWith(first.c)).toEqual({ code: 1000, reason: "replaced by a newer connection" })
      const other = yield* extension(ws, { name: "Firefox", access_token: t, client_id: "browser-2" })
      expect(other.id).not.toBe(first.id)
      const mcp = yield* client(ws, "alice")
      const list = yield* call(mcp, 2, "list_extensions")
      const ids = ((list.result as Message)["extensions"] as Array<Message>).map((e) => e["id"]).sort()
      expect(ids).toEqual([first.id, other.id].sort())
      // The replacement serves the connection.
      yield* call(mcp, 3, "connect", { extension_id: first.id })
      mcp.send({ jsonrpc: "2.0", id: 9, method: "getTabs" })
      const forwarded = yield* next(second.c)
      second.c.send({ jsonrpc: "2.0", id: forwarded.id, result: { from: "second" } })
      expect((yield* next(mcp)).result).toEqual({ from: "second" })
    }))

  it.scopedLive("closes an extension with a bad token, or one that never answers, with 1008", () =>
    Effect.gen(function*() {
      const ws = yield* start({ ROUTER_AUTH_TIMEOUT: "300 millis" })
      const bad = yield* connect(`${ws}/extension`)
      yield* next(bad)
      bad.send({ jsonrpc: "2.0", id: "proxy:1", result: { name: "Chrome", accessToken: "not-a-jwt" } })
      expect(yield* closedWith(bad)).toEqual({ code: 1008, reason: "Authentication failed: malformed token" })
      const old = expiredToken("alice")
      const expired = yield* connect(`${ws}/extension`)
      yield* next(expired)
      expired.send({ jsonrpc: "2.0", id: "proxy:1", result: { name: "Chrome", accessToken: old } })
      expect(yield* closedWith(expired)).toEqual({ code: 1008, reason: "Authentication failed: token expired" })
      const silent = yield* connect(`${ws}/extension`)
      expect((yield* closedWith(silent)).code).toBe(1008)
      const noToken = yield* connect(`${ws}/extension`)
      yield* next(noToken)
      noToken.send({ jsonrpc: "2.0", id: "proxy:1", result: { name: "Chrome" } })
      expect((yield* closedWith(noToken)).code).toBe(1008)
    }))

  it.scopedLive("refuses everything before mcp_handshake, and bad tokens, with -32000; nothing is forwarded", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const ext = yield* extension(ws, { name: "Chrome", accessToken: yield* token({ sub: "alice" }) })
      const mcp = yield* connect(`${ws}/mcp`)
      expect(yield* call(mcp, 1, "connect", { extension_id: ext.id })).toEqual({
        jsonrpc: "2.0",
        id: 1,
        error: { code: -32000, message: "Not authenticated: send mcp_handshake first" }
      })
      expect((yield* call(mcp, 2, "createTab")).error).toEqual({ code: -32000, message: "Not authenticated: send mcp_handshake first" })
      expect(yield* call(mcp, 3, "mcp_handshake", { accessToken: "garbage" })).toEqual({
        jsonrpc: "2.0",
        id: 3,
        error: { code: -32000, message: "Authentication failed: malformed token" }
      })
      const forged = (yield* token({ sub: "alice" })).slice(0, -3) + "abc"
      expect((yield* call(mcp, 4, "mcp_handshake", { access_token: forged })).error).toEqual({
        code: -32000,
        message: "Authentication failed: signature verification failed"
      })
      expect((yield* call(mcp, 5, "mcp_handshake", {})).error).toMatchObject({ code: -32000 })
      // Nothing sent before the handshake reached the extension: the first thing it sees is this.
      mcp.send({ jsonrpc: "2.0", id: 6, method: "mcp_handshake", params: { accessToken: yield* token({ sub: "alice" }) } })
      expect((yield* next(mcp)).result).toMatchObject({ authenticated: true })
      yield* call(mcp, 7, "connect", { extension_id: ext.id })
      mcp.send({ jsonrpc: "2.0", id: 8, method: "getTabs" })
      expect(yield* next(ext.c)).toMatchObject({ id: expect.stringMatching(/:8$/), method: "getTabs" })
    }))

  it.scopedLive("keeps users apart: another user's extension is refused and never listed", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const alices = yield* extension(ws, { name: "Alice's Chrome", accessToken: yield* token({ sub: "alice" }) })
      const bob = yield* client(ws, "bob")
      expect((yield* call(bob, 2, "list_extensions")).result).toEqual({ extensions: [] })
      expect(yield* call(bob, 3, "connect", { extension_id: alices.id })).toEqual({
        jsonrpc: "2.0",
        id: 3,
        error: { code: -32000, message: "Extension not found or not accessible" }
      })
      expect((yield* call(bob, 4, "connect", { extension_id: "ext-does-not-exist" })).error).toEqual({
        code: -32000,
        message: "Extension not found or not accessible"
      })
      expect((yield* call(bob, 5, "connect", {})).error).toMatchObject({ code: -32602 })
      const alice = yield* client(ws, "alice")
      yield* call(alice, 2, "connect", { extension_id: alices.id })
      expect(yield* call(alice, 3, "connect", { extension_id: alices.id })).toEqual({
        jsonrpc: "2.0",
        id: 3,
        error: { code: -32001, message: "MCP client already connected to an extension" }
      })
    }))

  it.scopedLive("refuses reserved id prefixes with -32600, echoing the id", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const { mcp } = yield* connected(ws)
      for (const id of ["proxy:1", "proxy:auth", "ext:1"]) {
        expect(yield* call(mcp, id, "createTab")).toEqual({
          jsonrpc: "2.0",
          id,
          error: { code: -32600, message: `Invalid Request: ids starting with "proxy:" or "ext:" are reserved` }
        })
      }
      expect((yield* call(mcp, "proxy:2", "mcp_handshake", { accessToken: "x" })).error).toMatchObject({ code: -32600 })
    }))

  it.scopedLive("answers malformed frames with -32700/-32600 and keeps the socket open", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const { ext, mcp } = yield* connected(ws)
      mcp.send("{not json")
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: null, error: { code: -32700, message: expect.stringMatching(/^Parse error/) } })
      mcp.send("[1,2]")
      expect(yield* next(mcp)).toMatchObject({ id: null, error: { code: -32600 } })
      mcp.send({ jsonrpc: "2.0", id: 7, method: 12 })
      expect(yield* next(mcp)).toMatchObject({ id: 7, error: { code: -32600 } })
      mcp.send({ jsonrpc: "1.0", id: 8, method: "createTab" })
      expect(yield* next(mcp)).toMatchObject({ id: 8, error: { code: -32600 } })
      mcp.send({ jsonrpc: "2.0", id: { nested: true }, method: "createTab" })
      expect(yield* next(mcp)).toMatchObject({ id: null, error: { code: -32600 } })
      // The extension gets the same treatment and stays connected.
      ext.c.send("}{")
      expect(yield* next(ext.c)).toMatchObject({ id: null, error: { code: -32700 } })
      // Still working both ways.
      mcp.send({ jsonrpc: "2.0", id: 9, method: "getTabs" })
      const forwarded = yield* next(ext.c)
      ext.c.send({ jsonrpc: "2.0", id: forwarded.id, result: [] })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 9, result: [] })
    }))

  it.scopedLive("turns an extension reply with neither result nor error into -32603", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const { ext, mcp } = yield* connected(ws)
      mcp.send({ jsonrpc: "2.0", id: 11, method: "click" })
      const forwarded = yield* next(ext.c)
      ext.c.send({ jsonrpc: "2.0", id: forwarded.id })
      expect(yield* next(mcp)).toMatchObject({ jsonrpc: "2.0", id: 11, error: { code: -32603 } })
    }))

  it.scopedLive("turns a malformed extension reply (both result and error, an error that is no object) into -32603", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const { ext, mcp } = yield* connected(ws)
      const malformed = [
        (id: unknown) => ({ jsonrpc: "2.0", id, result: {}, error: { code: -32000, message: "both" } }),
        (id: unknown) => ({ jsonrpc: "2.0", id, error: "not an object" }),
        (id: unknown) => ({ jsonrpc: "2.0", id, error: { code: "-1", message: 7 } })
      ]
      for (const [n, reply] of malformed.entries()) {
        mcp.send({ jsonrpc: "2.0", id: n, method: "click" })
        ext.c.send(reply((yield* next(ext.c)).id))
        expect(yield* next(mcp)).toEqual({
          jsonrpc: "2.0",
          id: n,
          error: { code: -32603, message: "Internal error: the extension answered with a malformed response" }
        })
      }
    }))

  it.scopedLive("gives each of three clients with colliding ids exactly its own answers", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const ext = yield* extension(ws, { name: "Chrome", accessToken: yield* token({ sub: "alice" }) })
      yield* echoing(ext.c)
      const clients = yield* Effect.forEach([0, 1, 2], () => client(ws, "alice"))
      yield* Effect.forEach(clients, (c) => call(c, 2, "connect", { extension_id: ext.id }))
      const ids = Array.from({ length: 30 }, (_, i) => i)
      clients.forEach((c, who) => ids.forEach((id) => c.send({ jsonrpc: "2.0", id, method: "type", params: { who, id } })))
      yield* Effect.forEach(
        clients,
        (c, who) =>
          Effect.gen(function*() {
            const answers = yield* Effect.forEach(ids, () => next(c))
            expect(answers.map((a) => a.id).sort((a, b) => Number(a) - Number(b))).toEqual(ids)
            for (const a of answers) expect(a.result).toEqual({ method: "type", params: { who, id: a.id } })
          }),
        { concurrency: "unbounded" }
      )
    }))

  it.scopedLive("when the extension goes, every client is told and its pending requests fail at once", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const ext = yield* extension(ws, { name: "Chrome", accessToken: yield* token({ sub: "alice" }) })
      const a = yield* client(ws, "alice")
      const b = yield* client(ws, "alice")
      const ca = ((yield* call(a, 2, "connect", { extension_id: ext.id })).result as Message)["connection_id"]
      const cb = ((yield* call(b, 2, "connect", { extension_id: ext.id })).result as Message)["connection_id"]
      a.send({ jsonrpc: "2.0", id: 10, method: "screenshot" })
      a.send({ jsonrpc: "2.0", id: 11, method: "screenshot" })
      yield* next(ext.c)
      yield* next(ext.c)
      ext.c.ws.close()
      const fromA = yield* Effect.forEach([0, 1, 2], () => next(a))
      expect(fromA).toEqual(
        expect.arrayContaining([
          { jsonrpc: "2.0", id: 10, error: { code: -32000, message: "Extension disconnected: Extension closed" } },
          { jsonrpc: "2.0", id: 11, error: { code: -32000, message: "Extension disconnected: Extension closed" } },
          { jsonrpc: "2.0", method: "disconnected", params: { connection_id: ca, reason: "Extension closed" } }
        ])
      )
      expect(yield* next(b)).toEqual({ jsonrpc: "2.0", method: "disconnected", params: { connection_id: cb, reason: "Extension closed" } })
      expect((yield* call(a, 12, "screenshot")).error).toEqual({ code: -32000, message: "Not connected to an extension" })
      expect((yield* call(a, 13, "list_extensions")).result).toEqual({ extensions: [] })
    }))

  it.scopedLive("when a client goes, its late replies are dropped and the extension serves others", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const { ext, mcp } = yield* connected(ws)
      mcp.send({ jsonrpc: "2.0", id: 1, method: "slowThing" })
      const orphaned = yield* next(ext.c)
      mcp.ws.close()
      yield* closedWith(mcp)
      expect((yield* nextStatus(ext.c)).params).toMatchObject({ peer_count: 0 })
      ext.c.send({ jsonrpc: "2.0", id: orphaned.id, result: { late: true } })
      const other = yield* client(ws, "alice")
      yield* call(other, 2, "connect", { extension_id: ext.id })
      other.send({ jsonrpc: "2.0", id: 1, method: "fast" })
      const fresh = yield* next(ext.c)
      ext.c.send({ jsonrpc: "2.0", id: fresh.id, result: { late: false } })
      expect(yield* next(other)).toEqual({ jsonrpc: "2.0", id: 1, result: { late: false } })
    }))

  it.scopedLive("times out forwarded requests with -32000", () =>
    Effect.gen(function*() {
      const ws = yield* start({ ROUTER_REQUEST_TIMEOUT: "300 millis" })
      const { ext, mcp } = yield* connected(ws)
      mcp.send({ jsonrpc: "2.0", id: 21, method: "hang" })
      const forwarded = yield* next(ext.c)
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 21, error: { code: -32000, message: "Request timed out after 300ms" } })
      ext.c.send({ jsonrpc: "2.0", id: forwarded.id, result: { tooLate: true } })
      mcp.send({ jsonrpc: "2.0", id: 22, method: "next" })
      const again = yield* next(ext.c)
      ext.c.send({ jsonrpc: "2.0", id: again.id, result: { ok: true } })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 22, result: { ok: true } })
    }))

  it.scopedLive("answers over the pending cap and the rate limits with errors, never silently", () =>
    Effect.gen(function*() {
      const ws = yield* start({ ROUTER_MAX_PENDING: "2", ROUTER_CONNECTION_RATE: "5" })
      const { ext, mcp } = yield* connected(ws)
      for (const id of [1, 2, 3]) mcp.send({ jsonrpc: "2.0", id, method: "wait" })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 3, error: { code: -32000, message: "Too many pending requests (limit 2)" } })
      const [f1, f2] = [yield* next(ext.c), yield* next(ext.c)]
      ext.c.send({ jsonrpc: "2.0", id: f1!.id, result: {} })
      ext.c.send({ jsonrpc: "2.0", id: f2!.id, result: {} })
      yield* next(mcp)
      yield* next(mcp)
      // Burst 10 at 5/s: two were taken above, eight more pass, then the limit answers.
      const answers: Array<Message> = []
      yield* echoing(ext.c)
      for (let id = 100; id < 115; id++) mcp.send({ jsonrpc: "2.0", id, method: "burst" })
      for (let i = 0; i < 15; i++) answers.push(yield* next(mcp))
      const limited = answers.filter((a) => (a.error as Message | undefined)?.["message"] === "Rate limit exceeded")
      expect(limited.length).toBeGreaterThan(0)
      expect(answers.length - limited.length).toBeGreaterThan(0)
    }))

  it.scopedLive("keeps other connections fast while one extension is slow", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const slow = yield* connected(ws, "alice")
      const fast = yield* connected(ws, "bob")
      yield* echoing(fast.ext.c)
      for (let id = 0; id < 50; id++) slow.mcp.send({ jsonrpc: "2.0", id, method: "slow" })
      yield* Effect.forEach(Array.from({ length: 50 }), () => next(slow.ext.c))
      const started = Date.now()
      for (let id = 0; id < 50; id++) fast.mcp.send({ jsonrpc: "2.0", id, method: "fast" })
      const answers = yield* Effect.forEach(Array.from({ length: 50 }), () => next(fast.mcp))
      expect(answers.every((a) => "result" in a)).toBe(true)
      expect(Date.now() - started).toBeLessThan(2_000)
      // The slow one still has all fifty in flight, and they still complete.
      const stillPending = yield* Effect.either(Effect.timeout(next(slow.mcp), "200 millis"))
      expect(stillPending._tag).toBe("Left")
    }))
})
