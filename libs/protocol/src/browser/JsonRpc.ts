/**
 * JSON-RPC 2.0 as plain TypeScript: ids, error codes, guards, and the text builders every sender
 * uses. Nothing under `browser/` imports effect or Node (`test/Browser.test.ts` bundles it to keep
 * it so), so the browser bundles (the extension, `/embed`) share these with the services at no
 * cost in bytes; `../JsonRpc.ts` adds the Schemas and the decode point.
 */

export const ErrorCode = {
  ParseError: -32700,
  InvalidRequest: -32600,
  MethodNotFound: -32601,
  InvalidParams: -32602,
  InternalError: -32603,
  /** -32000..-32099 are "server errors": application-specific (auth, routing, limits). */
  ServerError: -32000,
  ServerError1: -32001,
  /** MCP's "request cancelled" (LSP's code, which MCP clients use for a call they gave up on). */
  RequestCancelled: -32800
} as const

export type Id = string | number

export interface ErrorObject {
  readonly code: number
  readonly message: string
  readonly data?: unknown
}

export interface ErrorAnswer {
  readonly jsonrpc: "2.0"
  readonly id: Id | null
  readonly error: ErrorObject
}

/** A JSON object (not an array, not null). */
export const isRecord = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && !Array.isArray(u)

/** A request id: a string, or a finite number (JSON has no other). */
export const isId = (u: unknown): u is Id => typeof u === "string" || (typeof u === "number" && Number.isFinite(u))

export const errorResponse = (id: Id | null, code: number, message: string, data?: unknown): ErrorAnswer =>
  data === undefined ? { jsonrpc: "2.0", id, error: { code, message } } : { jsonrpc: "2.0", id, error: { code, message, data } }

// The builders below write text, not objects: what they build goes straight onto a socket or the
// bus, and every tool call makes a few of them.

export const request = (id: Id, method: string, params: object) => JSON.stringify({ jsonrpc: "2.0", id, method, params })

/** A notification; without `params` it has no `params` member at all (JSON.stringify drops it). */
export const notification = (method: string, params?: object) => JSON.stringify({ jsonrpc: "2.0", method, params })

/** A success response. `value` must not be undefined: the member would vanish from the text. */
export const result = (id: Id, value: unknown) => JSON.stringify({ jsonrpc: "2.0", id, result: value })

export const failure = (id: Id | null, code: number, message: string) => JSON.stringify(errorResponse(id, code, message))
