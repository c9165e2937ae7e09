/**
 * The messages the extension's parts exchange: JSON-RPC 2.0 on its sockets, the content script's
 * port to the service worker, and the `@mcp-b/transports` tab envelope on `window.postMessage`.
 * JSON-RPC itself, and what the extension says to the proxy and the registry, come from
 * `@switchboard/protocol/browser`, shared with the services.
 */
import * as JsonRpc from "@switchboard/protocol/browser/JsonRpc"
import type * as Registry from "@switchboard/protocol/browser/Registry"

export type Json = Record<string, unknown>

/** An error a method throws to answer with a JSON-RPC error a person can act on. */
export class MethodError extends Error {
  constructor(
    message: string,
    readonly code: number = JsonRpc.ErrorCode.ServerError
  ) {
    super(message)
  }
}

/** The error in a thrown value, for the wire. */
export const errorOf = (e: unknown): JsonRpc.ErrorObject =>
  e instanceof MethodError ? { code: e.code, message: e.message } : { code: JsonRpc.ErrorCode.ServerError, message: e instanceof Error ? e.message : String(e) }

// --- the content script's port to the service worker --------------------------------------

export const PortName = "switchboard-mcp-b"

/** A tool as the page lists it (MCP `Tool`), every field kept. */
export type PageTool = Json & { readonly name: string }

/** MCP progress, as a call reports it (the token is the relay's business). */
export interface Progress {
  readonly progress: number
  readonly total?: number
  readonly message?: string
}

/** Content script → service worker; `id` is the registry's id of a `browser/executeTool`. */
export type FromPage =
  | { readonly type: "tools"; readonly tools: ReadonlyArray<PageTool> }
  | ({ readonly type: "result"; readonly id: JsonRpc.Id } & Registry.ExecuteResult)
  | ({ readonly type: "progress"; readonly id: JsonRpc.Id } & Progress)

/** Service worker → content script. */
export type ToPage =
  | { readonly type: "execute"; readonly id: JsonRpc.Id; readonly toolName: string; readonly args: Json; readonly progress: boolean }
  | { readonly type: "cancel"; readonly id: JsonRpc.Id; readonly reason?: string }

// --- the @mcp-b/transports tab envelope ------------------------------------------------------

/** The channel `@mcp-b/global` serves on. */
export const TabChannel = "mcp-default"
/** The channel our MAIN-world script serves `document.modelContext` on, in the same envelope. */
export const ModelContextChannel = "switchboard-model-context"

export type Direction = "client-to-server" | "server-to-client"

export interface Envelope {
  readonly channel: string
  readonly type: "mcp"
  readonly direction: Direction
  readonly payload: unknown
}

export const envelope = (channel: string, direction: Direction, payload: unknown): Envelope => ({ channel, type: "mcp", direction, payload })

/** `data` as an envelope on `channel` going `direction`, or undefined. */
export const envelopeOf = (data: unknown, channel: string, direction: Direction): Envelope | undefined =>
  JsonRpc.isRecord(data) && data["channel"] === channel && data["type"] === "mcp" && data["direction"] === direction ? (data as unknown as Envelope) : undefined

/**
 * Only the page's own window speaks for the page: a frame, another window or another origin can
 * post to it too, and the page's MCP server posts with targetOrigin '*'.
 */
export const fromOwnWindow = (event: MessageEvent): boolean => event.source === window && event.origin === window.location.origin
