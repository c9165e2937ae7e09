/** The `/mcp` actor alone, on the embedded bus: the handshake, and a request forwarded to an extension's actor. */
import { describe, expect, it } from "@effect/vitest"
import { Bus, Kv, Peer, Subjects } from "@switchboard/bus"
import { Proxy } from "@switchboard/protocol"
import * as ActorClient from "@switchboard/testing/ActorClient"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { call, extension, mcpClient, next, nextBut, token, withRouter } from "./Harness.ts"

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

/**
 * A client actor learns that its extension is gone from the extension actor's `ExtensionGone`.
 * When that message never comes (lost on the bus, or never sent to a connection the extension's
 * actor no longer knows), a request that times out makes the client actor ask the extension's
 * actor (`Proxy.Probe`), and a "no" or nobody answering ends the session as `ExtensionGone` would.
 */
describe("a client session whose extension's actor no longer knows it", () => {
  const routerPeers = Peer.protocol(Proxy.RouterPeer)
  const quick = { ROUTER_REQUEST_TIMEOUT: "300 millis", ROUTER_STATUS_INTERVAL: "1 hour" }

  /** A client of alice connected to her extension, and its connection id. */
  const connectedPair = Effect.gen(function*() {
    const ext = yield* extension("alice")
    const client = yield* mcpClient("alice")
    const connected = yield* call(client, 2, "connect", { extension_id: ext.id })
    const connectionId = connected.result?.["connection_id"]
    if (typeof connectionId !== "string") return yield* Effect.dieMessage(`connect failed: ${JSON.stringify(connected)}`)
    expect(yield* next(client)).toMatchObject({ method: "status", params: { connected: true, peer_count: 1 } })
    return { ext, client, connectionId }
  })

  /** The session's end, which the old code never came to: bounded, so that the test fails rather than hangs. */
  const ended = (client: ActorClient.ActorClient) =>
    nextBut(client, "").pipe(Effect.timeoutFail({ duration: "5 seconds", onTimeout: () => new Error("the session did not end") }), Effect.orDie)

  /** The extension's actor forgets the connection without telling the client, as after a lost message. */
  const forget = (extConn: Subjects.ConnId, connectionId: string) =>
    Effect.flatMap(Bus.Bus, (bus) => Effect.sync(() => routerPeers.tell(Peer.outside(bus, "router"), extConn, new Proxy.Detach({ connectionId }))))

  it.live("ends the session when a request times out and the extension's actor says it is not attached", () =>
    withRouter(Effect.gen(function*() {
      const { ext, client, connectionId } = yield* connectedPair
      yield* forget(ext.client.conn, connectionId)
      yield* client.send({ jsonrpc: "2.0", id: 7, method: "getTabs" })
      expect(yield* nextBut(client)).toEqual({ jsonrpc: "2.0", id: 7, error: { code: -32000, message: "Request timed out after 300ms" } })
      // The same notice as when the extension closes, with a reason that says it is gone.
      expect(yield* ended(client)).toEqual({ jsonrpc: "2.0", method: "disconnected", params: { connection_id: connectionId, reason: "Extension gone" } })
      expect(yield* nextBut(client, "")).toMatchObject({ method: "status", params: { connected: false, peer_count: 0 } })
      expect(yield* sessionRecord(client.conn)).toEqual(Option.some({ role: "client", user: "alice" }))
      // Ended: the client may connect again, and the extension still answers.
      expect((yield* call(client, 8, "getTabs")).error).toEqual({ code: -32000, message: "Not connected to an extension" })
      expect((yield* call(client, 9, "connect", { extension_id: ext.id })).result).toMatchObject({ extension_id: ext.id })
    }), quick))

  it.live("ends the session when a request times out and nobody answers for the extension's connection", () =>
    withRouter(Effect.gen(function*() {
      const { ext, client, connectionId } = yield* connectedPair
      // Detached first, the extension's actor tells nobody as it ends: the client's ExtensionGone is "lost".
      yield* forget(ext.client.conn, connectionId)
      yield* ext.client.close()
      yield* ext.client.ended
      yield* client.send({ jsonrpc: "2.0", id: 7, method: "getTabs" })
      expect((yield* nextBut(client)).error).toEqual({ code: -32000, message: "Request timed out after 300ms" })
      expect(yield* ended(client)).toEqual({ jsonrpc: "2.0", method: "disconnected", params: { connection_id: connectionId, reason: "Extension gone" } })
      expect(yield* nextBut(client, "")).toMatchObject({ method: "status", params: { connected: false } })
    }), quick))

  it.live("a request that times out on a live extension leaves the session alone: no notice, and the next request goes through", () =>
    withRouter(Effect.gen(function*() {
      const { ext, client, connectionId } = yield* connectedPair
      yield* client.send({ jsonrpc: "2.0", id: 7, method: "slow" })
      const slow = yield* nextBut(ext.client)
      expect(slow.id).toBe(`${connectionId}:7`)
      expect((yield* nextBut(client)).error).toEqual({ code: -32000, message: "Request timed out after 300ms" })
      // The probe went to the extension's actor and back before this request reaches it: an actor
      // handles its mailbox in order, and the probe was asked as the timeout fired.
      yield* client.send({ jsonrpc: "2.0", id: 8, method: "getTabs" })
      const forwarded = yield* nextBut(ext.client)
      yield* ext.client.send({ jsonrpc: "2.0", id: forwarded.id, result: { tabs: [] } })
      expect(yield* nextBut(client, "")).toEqual({ jsonrpc: "2.0", id: 8, result: { tabs: [] } })
      expect(yield* client.pending).toBe(0)
    }), quick))
})
