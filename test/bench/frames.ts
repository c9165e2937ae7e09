/** JSON-RPC frames as the bench's fake peers read and answer them. */
import { JsonRpc } from "@switchboard/protocol"
import type { Duplex } from "node:stream"
import type { WebSocket } from "ws"

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
 * Sends on `ws`, corked until the end of this turn of the event loop, so that the answers to the
 * frames of one read leave in one write, as the edge's deliveries do. A peer that wrote each
 * answer on its own would spend a system call per message of the two cores it shares with the
 * server being measured.
 */
export const batchedSender = (ws: WebSocket) => {
  // ws keeps the TCP socket private; it is there once the socket is open.
  const socket = (ws as unknown as { readonly _socket: Duplex })._socket
  let corked = false
  const uncork = () => {
    corked = false
    socket.uncork()
  }
  return (data: string) => {
    if (!corked) {
      corked = true
      socket.cork()
      setImmediate(uncork)
    }
    ws.send(data)
  }
}
