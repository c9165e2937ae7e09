/** One `tools/call` through the hub and tab actors on the embedded bus: progress, cancellation, timeouts, retries. */
import { describe, expect, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import { hub, tab, toolsUntil, withRegistry } from "./Harness.ts"

const NAME = "website_tool_shop_example_com_tab1_slow"

describe("a tool call", () => {
  it.live("passes the tab's progress on under the client's token, and a client's cancel on to the tab", () =>
    withRegistry(Effect.gen(function*() {
      const shop = yield* tab({ user: "alice", tabId: 1, url: "https://shop.example.com/", tools: ["slow"] })
      const h = yield* hub("alice")
      yield* toolsUntil(h, (names) => names.includes(NAME))
      yield* h.client.send({ jsonrpc: "2.0", id: "c1", method: "tools/call", params: { name: NAME, _meta: { progressToken: "mine" } } })
      const execute = yield* shop.nextMessage
      // The tab sees the registry's id for the attempt, never the client's token.
      const mapped = execute.params?.["_meta"] as { progressToken: string }
      expect(mapped.progressToken).toBe(execute.id)
      yield* shop.notify("notifications/progress", { progressToken: mapped.progressToken, progress: 1, total: 2 })
      expect(yield* h.nextMessage).toEqual({ jsonrpc: "2.0", method: "notifications/progress", params: { progressToken: "mine", progress: 1, total: 2 } })

      yield* h.notify("notifications/cancelled", { requestId: "c1", reason: "changed my mind" })
      expect(yield* shop.nextMessage).toEqual({ jsonrpc: "2.0", method: "notifications/cancelled", params: { requestId: execute.id, reason: "changed my mind" } })
      // A late answer to a cancelled call goes nowhere; the next call's answer is the next message.
      yield* shop.client.send({ jsonrpc: "2.0", id: execute.id, result: { success: true, payload: "late" } })
      const next = yield* h.request("tools/call", { name: NAME }).pipe(
        Effect.zipLeft(Effect.gen(function*() {
          const again = yield* shop.nextMessage
          yield* shop.client.send({ jsonrpc: "2.0", id: again.id, result: { success: true, payload: "second" } })
        }), { concurrent: true })
      )
      expect(next.result).toEqual({ content: [{ type: "text", text: "second" }] })
      expect(h.received.filter((m) => m.id === "c1")).toEqual([])
    })))

  it.live("times out when the tab does not answer, and tells the tab the call is off", () =>
    withRegistry(Effect.gen(function*() {
      const shop = yield* tab({ user: "alice", tabId: 1, url: "https://shop.example.com/", tools: ["slow"] })
      const h = yield* hub("alice")
      yield* toolsUntil(h, (names) => names.includes(NAME))
      yield* h.client.send({ jsonrpc: "2.0", id: 1, method: "tools/call", params: { name: NAME } })
      const execute = yield* shop.nextMessage
      expect(yield* h.responseTo(1)).toEqual({
        jsonrpc: "2.0",
        id: 1,
        error: { code: -32603, message: "Tool call timed out after 300ms in tab 1 of shop.example.com" }
      })
      expect(yield* shop.nextMessage).toEqual({ jsonrpc: "2.0", method: "notifications/cancelled", params: { requestId: execute.id, reason: "timed out" } })
    }), { REGISTRY_CALL_TIMEOUT: "300 millis" }))

  it.live("sends the call again to another tab of the domain when its tab closes mid-call", () =>
    withRegistry(Effect.gen(function*() {
      const first = yield* tab({ user: "alice", tabId: 1, url: "https://shop.example.com/", tools: ["slow"] })
      const h = yield* hub("alice")
      yield* toolsUntil(h, (names) => names.includes(NAME))
      yield* h.client.send({ jsonrpc: "2.0", id: 1, method: "tools/call", params: { name: NAME } })
      yield* first.nextMessage
      const second = yield* tab({ user: "alice", tabId: 2, url: "https://shop.example.com/b", tools: ["slow"] })
      yield* first.client.close()
      const retried = yield* second.nextMessage
      expect(retried).toMatchObject({ method: "browser/executeTool", params: { toolName: "slow" } })
      yield* second.client.send({ jsonrpc: "2.0", id: retried.id, result: { success: false, payload: "out of stock" } })
      // The tabs opening and closing meanwhile may each have told the session list_changed.
      expect(yield* h.responseTo(1)).toEqual({ jsonrpc: "2.0", id: 1, result: { content: [{ type: "text", text: "out of stock" }], isError: true } })
    }), { REGISTRY_RETRY_BACKOFF: "10 millis" }))
})
