/**
 * Frame limits per path, as a real browser peer meets them: a full-page screenshot (about 1.5 MiB)
 * fits on `/extension` by default, while MCP client paths keep the smaller limit. A frame over its
 * path's limit closes the socket with 1009, the close is logged at info with its reason, and the
 * client whose extension went away is told why in its `disconnected` notification.
 */
import { describe, expect, it } from "@effect/vitest"
import { Router } from "@switchboard/router"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import { closedWith, connect } from "./support/Client.ts"
import * as Processes from "./support/Processes.ts"
import { attach, client, extensionOf, next } from "./support/ProxyPeers.ts"
import { namespace, serve } from "./support/Stack.ts"

const start = (env: Record<string, string> = {}) => Effect.map(serve(Router.layer, env), (s) => s.ws)

/** A base64 "PNG" of about `bytes` bytes, as a screenshot answer carries it. */
const screenshot = (bytes: number) => Buffer.alloc(Math.ceil((bytes * 3) / 4), 7).toString("base64")

describe("frame limits", () => {
  it.scopedLive("a 1.5 MiB screenshot answer reaches the client through /extension, while /mcp keeps its 1 MiB limit", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const ext = yield* extensionOf(ws, "alice")
      const mcp = yield* client(ws, "alice")
      yield* attach(mcp, ext.id)
      mcp.send({ jsonrpc: "2.0", id: 3, method: "screenshot", params: { fullPage: true } })
      const asked = yield* next(ext.c)
      const data = screenshot(1.5 * 1024 * 1024)
      ext.c.send({ jsonrpc: "2.0", id: asked.id, result: { data, mimeType: "image/png" } })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 3, result: { data, mimeType: "image/png" } })

      const other = yield* connect(`${ws}/mcp`)
      other.send("x".repeat(1024 * 1024 + 1))
      expect(yield* closedWith(other)).toEqual({ code: 1009, reason: "" })
    }))

  it.scopedLive("a frame over its path's limit closes with 1009, logged at info with the reason, and the client hears why", () =>
    Effect.gen(function*() {
      const proc = yield* Processes.allInOne({ namespace: namespace(), env: { EDGE_MAX_PAYLOAD_PATHS: "/extension=65536" } })
      const ext = yield* extensionOf(proc.ws, "alice")
      const mcp = yield* client(proc.ws, "alice")
      const connectionId = yield* attach(mcp, ext.id)
      mcp.send({ jsonrpc: "2.0", id: 3, method: "screenshot", params: {} })
      const asked = yield* next(ext.c)
      ext.c.send({ jsonrpc: "2.0", id: asked.id, result: { data: screenshot(100 * 1024), mimeType: "image/png" } })

      expect((yield* closedWith(ext.c)).code).toBe(1009)
      const why = "Extension closed: frame too large (over 65536 bytes)"
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 3, error: { code: -32000, message: `Extension disconnected: ${why}` } })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", method: "disconnected", params: { connection_id: connectionId, reason: why } })
      // The log line may trail the notification by a moment: it is written by another fiber.
      yield* Effect.suspend(() =>
        /level=INFO.*closed \/extension with 1009: frame too large \(over 65536 bytes\)/.test(proc.output()) ? Effect.void : Effect.fail("not yet")
      ).pipe(Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 100 }), Effect.orDieWith(() => new Error(`no info line in:\n${proc.output()}`)))
    }), { timeout: 90_000 })
})
