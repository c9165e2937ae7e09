/**
 * What the bridge needs of its link to the user's tool hub, whichever era that link speaks: the
 * legacy WebSocket session (`HubLink`) or the sessionless 2026-07-28 link (`ModernHubLink`).
 */
import type { CallToolResult } from "@modelcontextprotocol/server"
import * as z from "zod"
import type { Refused } from "./Refused.ts"
import type { Unreachable } from "./Unreachable.ts"

/**
 * A tool as the hub lists it, every field kept: the SDKs' own schemas drop fields they do not know
 * (the registry's `annotations.cache`), and the bridge relays rather than interprets.
 */
export const HubTool = z.looseObject({ name: z.string(), inputSchema: z.looseObject({ type: z.literal("object") }) })
export type HubTool = z.infer<typeof HubTool>
export const ToolsPage = z.looseObject({ tools: z.array(HubTool), nextCursor: z.string().optional() })

/** A tools/call as the host sent it; the link adds nothing but its own envelope. */
export interface ToolCall {
  readonly name: string
  readonly arguments?: Record<string, unknown> | undefined
}

export interface CallOptions {
  readonly signal?: AbortSignal
  readonly onprogress?: (progress: { progress: number; total?: number | undefined; message?: string | undefined }) => void
}

/**
 * A JSON-RPC error of the hub's (-32602 unknown tool, -32001 TabNotFound, ...), to reach the host as
 * the hub sent it. The SDKs put "MCP error <code>: " in front of a received error's message, and the
 * host's SDK puts it there again, so it is taken off here.
 */
export class HubRefusal extends Error {
  constructor(
    readonly code: number,
    message: string,
    readonly data: unknown
  ) {
    const prefix = `MCP error ${code}: `
    super(message.startsWith(prefix) ? message.slice(prefix.length) : message)
  }
}

export interface Upstream {
  start(): void
  stop(): Promise<void>
  /** Waits, at most `millis`, for the first attempt to reach the hub, so a host's first tools/list is complete. */
  ready(millis: number): Promise<void>
  /** Whether a host may start: waits, at most `millis`, and answers why not. */
  startup(millis: number): Promise<Refused | Unreachable | undefined>
  /** Every tool of the hub, all pages; while the hub is unreachable, the last list it gave. */
  tools(): Promise<ReadonlyArray<HubTool>>
  /** Relays one tools/call; throws `Unreachable`, `Refused` or `HubRefusal`. */
  call(params: ToolCall, options: CallOptions): Promise<CallToolResult>
}
