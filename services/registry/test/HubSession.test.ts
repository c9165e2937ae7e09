/** The `/hub` actor alone, on the embedded bus: an MCP session over its user's tabs. */
import { describe, expect, it } from "@effect/vitest"
import * as ActorClient from "@switchboard/testing/ActorClient"
import * as Effect from "effect/Effect"
import { hub, peer, tab, toolsUntil, withRegistry } from "./Harness.ts"

describe("the hub session", () => {
  it.live("lists its user's tabs' tools, never another user's, and calls one in its tab", () =>
    withRegistry(Effect.gen(function*() {
      const shop = yield* tab({ user: "alice", tabId: 1, url: "https://shop.example.com/", tools: ["getCart"] })
      yield* tab({ user: "bob", tabId: 1, url: "https://bank.example/", tools: ["transfer"] })
      const h = yield* hub("alice")
      expect(yield* toolsUntil(h, (names) => names.length > 0)).toEqual(["website_tool_shop_example_com_tab1_getCart"])

      yield* h.client.send({ jsonrpc: "2.0", id: 7, method: "tools/call", params: { name: "website_tool_shop_example_com_tab1_getCart", arguments: { q: 1 } } })
      const execute = yield* shop.nextMessage
      expect(execute).toMatchObject({ method: "browser/executeTool", params: { toolName: "getCart", args: { q: 1 } } })
      yield* shop.client.send({ jsonrpc: "2.0", id: execute.id, result: { success: true, payload: "3 items" } })
      expect(yield* h.responseTo(7)).toEqual({ jsonrpc: "2.0", id: 7, result: { content: [{ type: "text", text: "3 items" }] } })
    })))

  it.live("checks a session's requests: initialize first, then tools/call's params", () =>
    withRegistry(Effect.gen(function*() {
      const raw = peer(yield* ActorClient.open("registry", { path: "/hub", user: "alice" }))
      expect((yield* raw.request("tools/list")).error).toEqual({ code: -32600, message: "Invalid Request: the session is not initialized; send initialize first" })
      const init = yield* raw.request("initialize", { protocolVersion: "1999-01-01" })
      expect(init.result).toMatchObject({ protocolVersion: "2025-11-25", capabilities: { tools: { listChanged: true } } })

      const invalid = { code: -32602, message: "Invalid params: tools/call expects {name: string, arguments?: object}" }
      expect((yield* raw.request("tools/call", { arguments: {} })).error).toEqual(invalid)
      expect((yield* raw.request("tools/call", { name: "x", arguments: [1] })).error).toEqual(invalid)
      expect((yield* raw.request("tools/call", { name: "x", _meta: { progressToken: true } })).error).toEqual(invalid)
      expect((yield* raw.request("tools/call", { name: "nope" })).error).toEqual({
        code: -32602,
        message: "Unknown tool: nope; tools/list shows what the open tabs offer"
      })
      expect((yield* raw.request("tools/list", { cursor: "x" })).error).toEqual({ code: -32602, message: "Invalid params: unknown cursor" })
      expect((yield* raw.request("resources/list")).error).toEqual({ code: -32601, message: "Method not found: resources/list" })
    })))

  it.live("tells an initialized session list_changed when a tab registers", () =>
    withRegistry(Effect.gen(function*() {
      const h = yield* hub("alice")
      yield* toolsUntil(h, (names) => names.length === 0)
      yield* tab({ user: "alice", tabId: 4, url: "https://docs.example.org/", tools: ["search"] })
      expect(yield* h.nextMessage).toEqual({ jsonrpc: "2.0", method: "notifications/tools/list_changed" })
      expect(yield* toolsUntil(h, (names) => names.length === 1)).toEqual(["website_tool_docs_example_org_tab4_search"])
    })))

  it.live("closes a session that sends anything but authenticate before saying who it is", () =>
    withRegistry(Effect.gen(function*() {
      const anonymous = yield* ActorClient.open("registry", { path: "/hub" })
      yield* anonymous.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: {} })
      expect(yield* anonymous.closedByService).toEqual({ code: 1008, reason: "Authentication required: send authenticate first, or connect with ?token=" })
    })))

  it.live("over Streamable HTTP, answers each request on the exchange it came on, and only for the session's user", () =>
    withRegistry(Effect.gen(function*() {
      const session = yield* ActorClient.open("registry", { path: "/hub", user: "alice", transport: "http" })
      yield* session.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-03-26" } }, { http: "post-1", user: "alice" })
      const answer = yield* session.next
      expect({ http: answer.http, end: answer.end }).toEqual({ http: "post-1", end: true })
      expect(JSON.parse(answer.text)).toMatchObject({ id: 1, result: { protocolVersion: "2025-03-26" } })

      yield* session.send({ jsonrpc: "2.0", id: 2, method: "ping" }, { http: "post-2", user: "mallory" })
      const refused = yield* session.next
      expect(refused.http).toBe("post-2")
      expect(JSON.parse(refused.text)).toEqual({ jsonrpc: "2.0", id: null, error: { code: -32600, message: "Invalid Request: this session belongs to another user" } })
      // A malformed request is answered, and the session carries on (a WebSocket would be closed).
      yield* session.send("{not json", { http: "post-3", user: "alice" })
      expect(JSON.parse((yield* session.next).text)).toMatchObject({ error: { code: -32700 } })
      yield* session.send({ jsonrpc: "2.0", id: 4, method: "ping" }, { http: "post-4", user: "alice" })
      expect(JSON.parse((yield* session.next).text)).toEqual({ jsonrpc: "2.0", id: 4, result: {} })
    })))

  it.live("answers initialize with the client's protocol version when supported, the newest otherwise, and -32602 for a bad shape", () =>
    withRegistry(Effect.gen(function*() {
      const h = peer(yield* ActorClient.open("registry", { path: "/hub", user: "alice" }))
      expect((yield* h.request("initialize", { protocolVersion: "2025-03-26", capabilities: {} })).result?.["protocolVersion"]).toBe("2025-03-26")
      expect((yield* h.request("initialize", { protocolVersion: "2025-06-18" })).result?.["protocolVersion"]).toBe("2025-06-18")
      expect((yield* h.request("initialize", { protocolVersion: "1999-01-01" })).result?.["protocolVersion"]).toBe("2025-11-25")
      expect((yield* h.request("initialize", {})).result?.["protocolVersion"]).toBe("2025-11-25")
      expect((yield* h.request("initialize", { protocolVersion: 20250618 })).error).toEqual({
        code: -32602,
        message: "Invalid params: initialize expects {protocolVersion: string} (protocolVersion: Expected string, actual 20250618)"
      })
      expect((yield* h.request("initialize", ["2025-06-18"])).error).toMatchObject({ code: -32602 })
      // The session carries on after a refused initialize.
      expect((yield* h.request("ping")).result).toEqual({})
    })))
})
