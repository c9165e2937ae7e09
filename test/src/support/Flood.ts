/**
 * A client that asks for much and reads nothing: a tab whose tool answers with 1 MiB progress
 * messages until it is cancelled, and an HTTP request on a raw socket that never reads its answer.
 * Together they are what a stalled (or hostile) Streamable HTTP client leaves an edge to buffer.
 */
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js"
import * as Effect from "effect/Effect"
import * as Net from "node:net"
import type { EdgeProcess } from "./Processes.ts"
import { MiB } from "./Rss.ts"
import { tab } from "./Tabs.ts"

export interface FloodEvents {
  /** The call was cancelled, with the reason the tab was given. */
  readonly cancelled: (reason: string) => void
  /** Every message was sent and none cancelled the call. */
  readonly exhausted: () => void
}

/** How long a flood's call stays open after its last message, unless it is cancelled first. */
const HOLD_MS = 5 * 60_000

/**
 * A page whose tool `flood` sends up to `limit` progress notifications of 1 MiB each, as fast as
 * its tab's socket takes them (`busy` says when it is behind), until it is cancelled; after the
 * last one it answers only once cancelled (or after `HOLD_MS`).
 */
const floodPage = (limit: number, busy: () => boolean, events: FloodEvents) => {
  const server = new McpServer({ name: "flood", version: "1.0.0" })
  const message = "x".repeat(MiB)
  server.registerTool("flood", { inputSchema: {} }, async (_args, extra) => {
    extra.signal.addEventListener("abort", () => events.cancelled(String(extra.signal.reason)))
    const progressToken = extra._meta?.progressToken
    for (let i = 1; i <= limit && !extra.signal.aborted && progressToken !== undefined; i++) {
      await extra.sendNotification({ method: "notifications/progress", params: { progressToken, progress: i, message } })
      do await new Promise((resolve) => setTimeout(resolve, 1))
      while (busy() && !extra.signal.aborted)
    }
    if (!extra.signal.aborted) {
      events.exhausted()
      // The call stays open, as a page still at work would: an answer now would race the edge's
      // cut of a response nobody reads, and a cut after the answer has no call left to cancel.
      await new Promise<void>((resolve) => {
        const bound = setTimeout(resolve, HOLD_MS)
        bound.unref()
        extra.signal.addEventListener("abort", () => resolve())
      })
    }
    return { content: [{ type: "text" as const, text: "flooded" }] }
  })
  return server
}

/** The name the hub gives the flooding tab's tool. */
export const FLOOD_TOOL = "website_tool_flood_example_com_tab1_flood"

/** A flooding tab of `user` (tab 1 of flood.example.com), closed with the scope. */
export const floodTab = (proc: Pick<EdgeProcess, "ws">, user: string, limit: number, events: FloodEvents) =>
  Effect.gen(function*() {
    // The page is made before its tab's socket is open.
    const socket: { current?: { readonly bufferedAmount: number } } = {}
    const bridge = yield* tab(proc.ws, floodPage(limit, () => (socket.current?.bufferedAmount ?? 0) > 4 * MiB, events), {
      user,
      tabId: 1,
      url: "https://flood.example.com/"
    })
    socket.current = bridge.socket
  })

/** One HTTP request on a fresh TCP connection whose answer is never read; the socket ends with the scope. */
export const unreadRequest = (port: number, head: string, body = "") =>
  Effect.acquireRelease(
    Effect.async<Net.Socket, Error>((resume) => {
      const socket = Net.connect(port, "127.0.0.1", () => {
        socket.pause()
        socket.write(`${head}Host: 127.0.0.1:${port}\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`)
        resume(Effect.succeed(socket))
      })
      socket.once("error", (e) => resume(Effect.fail(e)))
    }),
    (socket) => Effect.sync(() => socket.destroy())
  ).pipe(Effect.orDie)

/** `tools/call` of the flooding tab's tool with a progress token, in a request whose answer is never read. */
export const unreadCall = (proc: Pick<EdgeProcess, "port">, bearer: string, session: string, id: number | string = 7) =>
  unreadRequest(
    proc.port,
    `POST /hub HTTP/1.1\r\nAuthorization: Bearer ${bearer}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n` +
      `Mcp-Session-Id: ${session}\r\nMCP-Protocol-Version: 2025-06-18\r\n`,
    JSON.stringify({ jsonrpc: "2.0", id, method: "tools/call", params: { name: FLOOD_TOOL, arguments: {}, _meta: { progressToken: `p${id}` } } })
  )
