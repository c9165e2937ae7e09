/**
 * The MCP Proxy Protocol under attack, one group per attack (issue 12, "Hardening first"): forged
 * replies from extensions that don't own the connection, a socket switched to another user,
 * sockets held open without authenticating or by the thousand, and frames nested thousands deep.
 * Each test failed on the router before its fix.
 */
import { describe, expect, it } from "@effect/vitest"
import { Edge } from "@switchboard/edge"
import { Router } from "@switchboard/router"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { attach, call, client, extensionOf, handled, next } from "./support/ProxyPeers.ts"
import { busLayer, stack, token } from "./support/Stack.ts"

const start = (env: Record<string, string> = {}) =>
  Effect.gen(function*() {
    const ctx = yield* Layer.build(stack(busLayer(), { services: Router.layer, env }))
    const edge = ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape
    return edge.url.replace("http", "ws")
  })

/** Alice's extension and one connected client: the state most tests start from. */
const connected = (ws: string, sub = "alice") =>
  Effect.gen(function*() {
    const ext = yield* extensionOf(ws, sub)
    const mcp = yield* client(ws, sub)
    return { ext, mcp, connectionId: yield* attach(mcp, ext.id) }
  })

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
