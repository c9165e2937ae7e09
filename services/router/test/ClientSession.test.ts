/** The `/mcp` actor alone, on the embedded bus: the handshake, and a request forwarded to an extension's actor. */
import { describe, expect, it } from "@effect/vitest"
import { Kv, Subjects } from "@switchboard/bus"
import { Proxy } from "@switchboard/protocol"
import * as ActorClient from "@switchboard/testing/ActorClient"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { call, extension, mcpClient, nextBut, token, withRouter } from "./Harness.ts"

const sessionRecord = (conn: Subjects.ConnId) =>
  Effect.gen(function*() {
    const kv = yield* Kv.Kv
    const sessions = Kv.typed(yield* Effect.orDie(kv.bucket(Subjects.Bucket.sessions)), Proxy.SessionRecord)
    return Option.map(yield* Effect.orDie(sessions.get(Subjects.Key.session(conn))), (e) => e.value)
  })

describe("the client session", () => {
  it.live("answers mcp_handshake with the token's user, and remembers the socket's user for an adopter", () =>
    withRouter(Effect.gen(function*() {
      const client = yield* ActorClient.open("router", { path: "/mcp" })
      expect(yield* call(client, 1, "mcp_handshake", { accessToken: yield* token("alice") })).toEqual({
        jsonrpc: "2.0",
        id: 1,
        result: { authenticated: true, user_id: "alice", mcp_client_id: expect.stringMatching(/^mcp-[0-9a-f-]{36}$/) }
      })
      expect(yield* sessionRecord(client.conn)).toEqual(Option.some({ role: "client", user: "alice" }))
      // The snake_case spelling real clients moved to works as well.
      const snake = yield* ActorClient.open("router", { path: "/mcp" })
      expect((yield* call(snake, 1, "mcp_handshake", { access_token: yield* token("bob") })).result).toMatchObject({ authenticated: true, user_id: "bob" })
    })))

  it.live("refuses a repeated mcp_handshake with -32001, and the socket stays its first user's", () =>
    withRouter(Effect.gen(function*() {
      const client = yield* mcpClient("alice")
      expect(yield* call(client, 2, "mcp_handshake", { accessToken: yield* token("bob") })).toEqual({
        jsonrpc: "2.0",
        id: 2,
        error: { code: -32001, message: "MCP client already authenticated" }
      })
      expect(yield* sessionRecord(client.conn)).toEqual(Option.some({ role: "client", user: "alice" }))
      expect(yield* call(client, 3, "list_extensions")).toEqual({ jsonrpc: "2.0", id: 3, result: { extensions: [] } })
    })))

  it.live("refuses mcp_handshake's bad params and a bad token with -32000 saying what is wrong, and stays open", () =>
    withRouter(Effect.gen(function*() {
      const client = yield* ActorClient.open("router", { path: "/mcp" })
      expect((yield* call(client, 1, "mcp_handshake")).error).toEqual({ code: -32000, message: "Authentication failed: accessToken is required" })
      expect((yield* call(client, 2, "mcp_handshake", { accessToken: 42 })).error).toEqual({
        code: -32000,
        message: "Authentication failed: accessToken: Expected string, actual 42"
      })
      expect((yield* call(client, 3, "mcp_handshake", ["a token"])).error).toMatchObject({ code: -32000, message: expect.stringMatching(/^Authentication failed: Expected /) })
      const forged = yield* call(client, 4, "mcp_handshake", { accessToken: `${yield* token("alice")}x` })
      expect(forged.error).toEqual({ code: -32000, message: "Authentication failed: signature verification failed" })
      expect((yield* call(client, 5, "list_extensions")).error).toEqual({ code: -32000, message: "Not authenticated: send mcp_handshake first" })
      expect((yield* call(client, 6, "mcp_handshake", { accessToken: yield* token("alice") })).result).toMatchObject({ authenticated: true })
    })))

  it.live("connects to the user's extension and forwards a request under the mapped id, and the answer back under the client's", () =>
    withRouter(Effect.gen(function*() {
      const ext = yield* extension("alice")
      const client = yield* mcpClient("alice")
      const connected = yield* call(client, 2, "connect", { extension_id: ext.id })
      const connectionId = connected.result?.["connection_id"]
      expect(connected.result).toEqual({ connection_id: expect.stringMatching(/^conn-/), extension_id: ext.id, extension_name: "Chrome 141" })
      yield* client.send({ jsonrpc: "2.0", id: 7, method: "getTabs", params: {} })
      const forwarded = yield* nextBut(ext.client)
      expect(forwarded).toEqual({ jsonrpc: "2.0", id: `${String(connectionId)}:7`, method: "getTabs", params: {} })
      yield* ext.client.send({ jsonrpc: "2.0", id: forwarded.id, result: { tabs: [] } })
      expect(yield* nextBut(client)).toEqual({ jsonrpc: "2.0", id: 7, result: { tabs: [] } })
      // Another user's client cannot reach it.
      const mallory = yield* mcpClient("mallory")
      expect((yield* call(mallory, 2, "connect", { extension_id: ext.id })).error).toEqual({ code: -32000, message: "Extension not found or not accessible" })
    })))
})
