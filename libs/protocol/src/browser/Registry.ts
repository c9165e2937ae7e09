/**
 * The plain parts of MCP-B (`../Registry.ts` has the Schemas): method names, revisions and the
 * tab's answer to a call, which the extension's tab bridge and `/embed` share with the registry
 * without taking effect into their bundles.
 */
import { isRecord } from "./JsonRpc.ts"

/** MCP-B's own error code: no tab has (or could be opened for) the tool. */
export const TabNotFound = -32001

export const Method = {
  hello: "browser/hello",
  activated: "browser/activated",
  registerTools: "browser/registerTools",
  updateTools: "browser/updateTools",
  executeTool: "browser/executeTool"
} as const

/** The method a `/hub` or `/tabs` socket without a token at its upgrade sends first. */
export const Authenticate = "authenticate"

/**
 * The MCP revisions the hub's `initialize` answers (the session-based ones), newest first: each as
 * the client asks, an unknown one with the first.
 */
export const ProtocolVersions = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"] as const
/**
 * The `MCP-Protocol-Version` header values a Streamable HTTP request may carry; the transport
 * appeared in 2025-03-26, and a request without the header is taken to be of that version.
 */
export const HttpProtocolVersions = ["2025-11-25", "2025-06-18", "2025-03-26"] as const

/**
 * `browser/executeTool`'s params as the registry sends them: `_meta` only when the client asked
 * for progress, with the registry's own token for the call.
 */
export interface ExecuteToolParams {
  readonly toolName: string
  readonly args: Record<string, unknown>
  readonly _meta?: { readonly progressToken: string | number }
}

/** The tab's answer to `browser/executeTool`: `payload` is a `CallToolResult`, or an error string. */
export interface ExecuteResult {
  readonly success: boolean
  readonly payload: unknown
}
/** Checked by hand rather than by a Schema: it runs on every tool call, and only `success` has a type to check. */
export const isExecuteResult = (u: unknown): u is ExecuteResult => isRecord(u) && typeof u["success"] === "boolean"
