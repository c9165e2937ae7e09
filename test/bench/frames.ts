/** JSON-RPC frames as the bench's fake peers read and answer them, and its fake extension. */
import { JsonRpc } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import type { Duplex } from "node:stream"
import { WebSocket } from "ws"

/** The frame as a JSON object, or undefined when it is not one. */
export const parseRecord = (data: Buffer): Record<string, unknown> | undefined => {
  try {
    const message: unknown = JSON.parse(data.toString())
    return JsonRpc.isRecord(message) ? message : undefined
  } catch {
    return undefined
  }
}
export const isRecord = JsonRpc.isRecord
export const isId = (u: unknown): u is string | number => typeof u === "string" || typeof u === "number"
export const answer = (id: string | number, result: unknown) => JSON.stringify({ jsonrpc: "2.0", id, result })

/**
 * Sends on `ws`, corked until the next microtask checkpoint, so that the answers to the frames of
 * one read (ws emits them in one go) leave in one write, as the edge's deliveries do. A peer that
 * wrote each answer on its own would spend a system call per message of the two cores it shares
 * with the server being measured.
 */
export const batchedSender = (ws: WebSocket) => {
  // ws keeps the TCP socket private; it is there once the socket is open.
  const socket = (ws as unknown as { readonly _socket: Duplex })._socket
  let corked = false
  const uncork = () => {
    corked = false
    socket.uncork()
  }
  return (data: string | Uint8Array) => {
    if (!corked) {
      corked = true
      socket.cork()
      queueMicrotask(uncork)
    }
    ws.send(data, { binary: false })
  }
}

/**
 * The browser extension: one socket in the bench process that answers every request at once.
 * Not a helper process, on purpose: on a 2-core machine a third busy process would take CPU from
 * the very server being measured, and its share would differ between targets (one process for
 * naive-relay and embedded, five for distributed). In here its work is the same for every proxy
 * target (parse one frame, send one frame), so it cannot tilt the proxy targets against each other;
 * plain-ws-echo has no extension and so stays the ceiling it is meant to be.
 */
export const benchExtension = (url: string, token: string) =>
  Effect.acquireRelease(
    Effect.async<{ readonly ws: WebSocket; readonly extensionId: string }, Error>((resume) => {
      const ws = new WebSocket(url, { perMessageDeflate: false })
      let send = (data: string) => ws.send(data)
      ws.once("open", () => (send = batchedSender(ws)))
      ws.on("message", (data: Buffer) => {
        const message = parseRecord(data)
        if (message === undefined) return
        const id = message["id"]
        const method = message["method"]
        if (method === "authenticate" && isId(id)) return ws.send(answer(id, { name: "Bench", accessToken: token }))
        if (method === "authenticated") {
          const params = message["params"]
          const extensionId = isRecord(params) ? params["extension_id"] : undefined
          return resume(
            typeof extensionId === "string"
              ? Effect.succeed({ ws, extensionId })
              : Effect.fail(new Error(`authenticated without an extension_id: ${data.toString()}`))
          )
        }
        // Forwarded requests; notifications (status) carry no id and get no answer.
        if (typeof method === "string" && isId(id)) send(answer(id, {}))
      })
      ws.once("error", (e) => resume(Effect.fail(e)))
      ws.once("close", (code, reason) => resume(Effect.fail(new Error(`extension socket closed: ${code} ${reason.toString()}`))))
    }).pipe(Effect.timeoutFail({ duration: "15 seconds", onTimeout: () => new Error(`extension at ${url} was not authenticated within 15 s`) })),
    ({ ws }) => Effect.sync(() => ws.terminate())
  )
