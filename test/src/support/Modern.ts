/**
 * A plain MCP 2026-07-28 request to `/hub`, as a host writes it on the wire: the body's `_meta`
 * names the version, the client and its capabilities, and the headers mirror the body
 * (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`). One place, so that every test that needs a
 * status or a header the SDK hides speaks the same request.
 */
import { Modern } from "@switchboard/protocol"
import * as Effect from "effect/Effect"

export const ModernVersion = "2026-07-28"

/** A modern request's `_meta`: spread it and add what a test needs (a `traceparent`, say). */
export const modernMeta = (options: { readonly capabilities?: Record<string, unknown>; readonly clientName?: string } = {}) => ({
  [Modern.Meta.protocolVersion]: ModernVersion,
  [Modern.Meta.clientInfo]: { name: options.clientName ?? "raw", version: "0" },
  [Modern.Meta.clientCapabilities]: options.capabilities ?? {}
})

export interface ModernReply {
  readonly status: number
  readonly headers: Headers
  readonly text: string
  /** The answer's JSON-RPC message: the body, or an SSE stream's last data line; `{}` when there is none (a 202). */
  readonly json: () => Record<string, unknown>
}

export interface ModernRequestOptions {
  /** The bearer token; none sends an anonymous request. */
  readonly token?: string | undefined
  /** Headers that replace the mirrored ones, or add to them (an `Mcp-Param-*`, an `Origin`). */
  readonly headers?: Record<string, string>
  readonly signal?: AbortSignal
}

/** `Mcp-Name` mirrors the tool's name, or the task's id for the tasks extension's methods. */
const nameOf = (body: Record<string, unknown>): string | undefined => {
  const params = body["params"]
  if (typeof params !== "object" || params === null) return undefined
  const { name, taskId } = params as { readonly name?: unknown; readonly taskId?: unknown }
  return typeof name === "string" ? name : typeof taskId === "string" ? taskId : undefined
}

const lastMessage = (contentType: string | null, text: string): Record<string, unknown> => {
  const data = contentType?.startsWith("text/event-stream") === true
    ? text.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).at(-1) ?? ""
    : text
  return data === "" ? {} : JSON.parse(data) as Record<string, unknown>
}

/** A modern POST to `<base>/hub` (`base` is an edge's http or ws URL), for a test edge that owns its errors. */
export const modernFetch = async (base: string, body: Record<string, unknown>, options: ModernRequestOptions = {}): Promise<ModernReply> => {
  const name = nameOf(body)
  const res = await fetch(`${base.replace(/^ws/, "http")}/hub`, {
    method: "POST",
    ...(options.signal === undefined ? {} : { signal: options.signal }),
    headers: {
      accept: "application/json, text/event-stream",
      "content-type": "application/json",
      "mcp-protocol-version": ModernVersion,
      ...(typeof body["method"] === "string" ? { "mcp-method": body["method"] } : {}),
      ...(name === undefined ? {} : { "mcp-name": name }),
      ...(options.token === undefined ? {} : { authorization: `Bearer ${options.token}` }),
      ...options.headers
    },
    body: JSON.stringify(body)
  })
  const text = await res.text()
  const contentType = res.headers.get("content-type")
  return { status: res.status, headers: res.headers, text, json: () => lastMessage(contentType, text) }
}

/** {@link modernFetch} as an Effect that dies on a network failure, which no test expects; interrupted, it aborts the request. */
export const modernPost = (base: string, body: Record<string, unknown>, options: ModernRequestOptions = {}) =>
  Effect.promise((signal) => modernFetch(base, body, { ...options, signal: options.signal ?? signal }))
