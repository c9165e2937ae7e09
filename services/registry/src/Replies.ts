/**
 * The JSON-RPC texts the registry's actors send, built as strings: they go straight onto the bus,
 * and every tool call makes a few of them.
 */
import { JsonRpc } from "@switchboard/protocol"

export const notification = (method: string, params?: Record<string, unknown>) =>
  JSON.stringify(params === undefined ? { jsonrpc: "2.0", method } : { jsonrpc: "2.0", method, params })
export const result = (id: JsonRpc.Id, value: unknown) => JSON.stringify({ jsonrpc: "2.0", id, result: value })
export const failure = (id: JsonRpc.Id | null, code: number, message: string) => JsonRpc.encode(JsonRpc.errorResponse(id, code, message))
export const LIST_CHANGED = notification("notifications/tools/list_changed")

export const sameJson = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b)
