/** JSON-RPC frames as the bench's fake peers read and answer them. */
import { JsonRpc } from "@switchboard/protocol"

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
