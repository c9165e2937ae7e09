/**
 * One page of a user's `tools/list`, for a session (`HubSession.ts`) and for a request that needs
 * none (`Stateless.ts`) alike.
 */
import { type JsonRpc, Registry } from "@switchboard/protocol"
import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import * as Naming from "./Naming.ts"

const decodeListParams = Schema.decodeUnknownEither(Registry.ToolsListParams)

export interface Limits {
  readonly pageSize: number
  readonly pageBytes: number
}

/**
 * The page `params` asks for, as the JSON text of the result's fields before any the caller adds
 * (`"tools":[…]` and the `nextCursor` if there is more); undefined for a cursor this list never gave.
 * A page ends at pageSize tools or before pageBytes, whichever comes first, but holds at least one
 * tool: a page of large tools could otherwise outgrow what the bus and the edge carry, and the
 * client could never list. The tools are serialized once, to measure them, and joined as they are.
 */
export const page = (all: Naming.Aggregate, params: unknown, limits: Limits): string | undefined => {
  const decoded = decodeListParams(params ?? {})
  const cursor = Either.isRight(decoded) ? decoded.right.cursor : "-1"
  const offset = cursor === undefined ? 0 : Number(cursor)
  if (!Number.isSafeInteger(offset) || offset < 0 || offset > all.tools.length) return undefined
  const parts: Array<string> = []
  let bytes = 0
  let end = offset
  while (end < all.tools.length && parts.length < limits.pageSize) {
    const part = JSON.stringify(Naming.toMcp(all.tools[end]!))
    const size = Buffer.byteLength(part) + 1
    if (parts.length > 0 && bytes + size > limits.pageBytes) break
    parts.push(part)
    bytes += size
    end++
  }
  const next = end < all.tools.length ? `,"nextCursor":${JSON.stringify(String(end))}` : ""
  return `"tools":[${parts.join(",")}]${next}`
}

/** A `tools/list` answer around a page's fields and any more (`extra`, JSON text starting with a comma). */
export const answer = (id: JsonRpc.Id, fields: string, extra = "") => `{"jsonrpc":"2.0","id":${JSON.stringify(id)},"result":{${fields}${extra}}}`
