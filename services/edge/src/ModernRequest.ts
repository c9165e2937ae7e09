/**
 * Which era a POST at `/hub` belongs to, and the checks MCP 2026-07-28 asks of a modern one before
 * anything acts on it (`basic/transports/streamable-http.mdx`, "Request Metadata" and "Server
 * Validation"). Pure: the request's headers and its parsed body in, a verdict out.
 */
import { type JsonRpc, Modern, Registry } from "@switchboard/protocol"
import type * as Http from "node:http"

/** Every version the hub speaks, both eras, newest first: what an `UnsupportedProtocolVersionError` lists. */
export const Supported: ReadonlyArray<string> = [...Modern.Versions, ...Registry.HttpProtocolVersions]

const isLegacyVersion = (v: string) => (Registry.HttpProtocolVersions as ReadonlyArray<string>).includes(v)

const single = (value: string | ReadonlyArray<string> | undefined): string | undefined => (typeof value === "string" ? value : undefined)

/**
 * Whether a POST is of the modern era. `initialize` and `Mcp-Session-Id` are the legacy era's; a
 * modern request says its version in `_meta`, or at least in its header with no legacy version
 * there (it is then answered with what is wrong, in the modern era's terms, which a dual-era
 * client reads as "this server is modern").
 */
export const isModern = (headers: Http.IncomingHttpHeaders, message: Record<string, unknown>): boolean => {
  if (headers["mcp-session-id"] !== undefined || message["method"] === "initialize") return false
  if (Modern.metaOf(message)?.[Modern.Meta.protocolVersion] !== undefined) return true
  const version = single(headers["mcp-protocol-version"])
  return version !== undefined && !isLegacyVersion(version)
}

/** A modern request the hub will act on. */
export interface Accepted {
  readonly kind: "request"
  readonly method: Modern.Method
  readonly id: JsonRpc.Id
}

/** A notification: this era defines none that a client sends over HTTP, so it is taken (202) and needs nothing. */
export interface Notified {
  readonly kind: "notification"
}

/** Why a modern request is refused: its HTTP status and its JSON-RPC error. */
export interface Refused {
  readonly kind: "refused"
  readonly status: number
  readonly code: number
  readonly message: string
  readonly data?: unknown
  readonly id: JsonRpc.Id | null
}

const idOf = (message: Record<string, unknown>): JsonRpc.Id | undefined => {
  const id = message["id"]
  return typeof id === "string" || typeof id === "number" ? id : undefined
}

const NOTIFIED: Notified = { kind: "notification" }

const refused = (status: number, code: number, message: string, id: JsonRpc.Id | null, data?: unknown): Refused =>
  data === undefined ? { kind: "refused", status, code, message, id } : { kind: "refused", status, code, message, data, id }

const mismatch = (id: JsonRpc.Id | null, message: string): Refused => refused(400, Modern.ErrorCode.HeaderMismatch, `Header mismatch: ${message}`, id)

/** The checks of "Server Validation", in the order a client can best act on: version, then headers against body, then method. */
export const check = (headers: Http.IncomingHttpHeaders, message: Record<string, unknown>): Accepted | Notified | Refused => {
  const id = idOf(message) ?? null
  const method = message["method"]
  if (typeof method !== "string") {
    return refused(400, -32600, "Invalid Request: a client sends only requests and notifications, each with a string method", id)
  }
  const meta = Modern.metaOf(message)
  const header = single(headers["mcp-protocol-version"])
  const claimed = meta?.[Modern.Meta.protocolVersion]
  if (header === undefined) return mismatch(id, "the MCP-Protocol-Version header is required")
  if (claimed !== undefined && claimed !== header) {
    return mismatch(id, `MCP-Protocol-Version header value '${header}' does not match body value '${String(claimed)}'`)
  }
  if (!Modern.isVersion(header)) {
    return refused(400, Modern.ErrorCode.UnsupportedProtocolVersion, "Unsupported protocol version", id, { supported: Supported, requested: header })
  }
  if (claimed === undefined) return mismatch(id, `the body's params._meta must carry ${Modern.Meta.protocolVersion} (the MCP-Protocol-Version header says '${header}')`)
  const methodHeader = single(headers["mcp-method"])
  if (methodHeader === undefined) return mismatch(id, "the Mcp-Method header is required")
  if (methodHeader !== method) return mismatch(id, `Mcp-Method header value '${methodHeader}' does not match body value '${method}'`)
  if (method === "tools/call") {
    const raw = single(headers["mcp-name"])
    if (raw === undefined) return mismatch(id, "the Mcp-Name header is required for tools/call")
    const name = Modern.decodeHeaderValue(raw)
    if (name === undefined) return mismatch(id, "the Mcp-Name header is not valid =?base64?…?= encoding")
    const params = message["params"]
    const bodyName = typeof params === "object" && params !== null && !Array.isArray(params) ? (params as Record<string, unknown>)["name"] : undefined
    if (name !== bodyName) return mismatch(id, `Mcp-Name header value '${raw}' does not match body value '${String(bodyName)}'`)
  }
  if (Modern.isTaskMethod(method)) {
    // "the client MUST set the Mcp-Name header to the value of params.taskId" (ext-tasks, Routing Headers).
    const raw = single(headers["mcp-name"])
    if (raw === undefined) return mismatch(id, `the Mcp-Name header is required for ${method}`)
    const name = Modern.decodeHeaderValue(raw)
    if (name === undefined) return mismatch(id, "the Mcp-Name header is not valid =?base64?…?= encoding")
    const params = message["params"]
    const taskId = typeof params === "object" && params !== null && !Array.isArray(params) ? (params as Record<string, unknown>)["taskId"] : undefined
    if (name !== taskId) return mismatch(id, `Mcp-Name header value '${raw}' does not match body value '${String(taskId)}'`)
  }
  if (message["id"] === undefined) return NOTIFIED
  const requestId = idOf(message)
  if (requestId === undefined) return refused(400, -32600, "Invalid Request: id must be a string or a number", null)
  if (!Modern.isMethod(method)) return refused(404, -32601, `Method not found: ${method} (this hub serves ${Modern.Methods.join(", ")})`, requestId)
  const capabilities = meta?.[Modern.Meta.clientCapabilities]
  if (typeof capabilities !== "object" || capabilities === null || Array.isArray(capabilities)) {
    return refused(400, -32602, `Invalid params: params._meta must carry ${Modern.Meta.clientCapabilities} (an object; {} declares none)`, requestId)
  }
  if (Modern.isTaskMethod(method) && !Modern.declaresTasks(message)) {
    // The extension says so for tasks/get, tasks/update and tasks/cancel; as any -32021 over HTTP, with 400.
    return refused(400, Modern.ErrorCode.MissingRequiredClientCapability, `Missing required client capability: ${method} needs the ${Modern.TasksExtension} extension`, requestId, {
      requiredCapabilities: { extensions: { [Modern.TasksExtension]: {} } }
    })
  }
  return { kind: "request", method, id: requestId }
}
