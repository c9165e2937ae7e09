/**
 * The bridge's legacy-era session with the user's tool hub (`/hub`, MCP over WebSocket), used when
 * the hub does not offer 2026-07-28, kept up for as long as the bridge runs: it reconnects with
 * backoff whenever the socket drops, remembers the last tool list it saw, and tells the bridge when
 * the host should list again.
 */
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { type RequestOptions } from "@modelcontextprotocol/sdk/shared/protocol.js"
import { CallToolResultSchema, ErrorCode, McpError, ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js"
import type { CallToolResult } from "@modelcontextprotocol/server"
import { setTimeout as sleep } from "node:timers/promises"
import { Backoff } from "@switchboard/protocol/browser/Backoff"
import { HubTransport } from "./HubTransport.ts"
import { describe, type Log } from "./Log.ts"
import { FirstAttempt } from "./FirstAttempt.ts"
import { permanent, Refused } from "./Refused.ts"
import { UpgradeRefused } from "./Socket.ts"
import { Unreachable } from "./Unreachable.ts"
import { type CallOptions, HubRefusal, type HubTool, ToolsPage, type ToolCall, type Upstream } from "./Upstream.ts"

/** How long a request of the bridge's own (initialize, a tools/list page) may take. */
export const CONTROL_TIMEOUT = 10_000
/** A relayed call's upper bound; the hub has its own per-call timeout, and the host can cancel. */
export const CALL_TIMEOUT = 10 * 60_000
/** More pages than this is a hub that keeps handing out cursors. */
export const MAX_PAGES = 1_000
/** A connection that lived this long resets the backoff; one that drops at once keeps growing it. */
const STABLE_AFTER = 10_000

export interface HubLinkOptions {
  readonly url: URL
  /** The base URL the user gave, for messages. */
  readonly name: string
  readonly token: string
  readonly version: string
  readonly log: Log
  /** The host should list tools again: the hub said so, or the bridge (re)connected. */
  readonly onToolsChanged: () => void
}

export class HubLink implements Upstream {
  private client: Client | undefined
  private known: ReadonlyArray<HubTool> = []
  private readonly stopping = new AbortController()
  private readonly backoff = new Backoff()
  private readonly firstAttempt = new FirstAttempt()
  /** Settles on the first connection, or on a refusal: what a host's initialize waits for. */
  private readonly decided = new FirstAttempt()
  /** Set once Switchboard refused the configuration; the link has stopped trying. */
  private refused: Refused | undefined
  private lastError = "no attempt finished yet"

  constructor(private readonly options: HubLinkOptions) {}

  start(): void {
    this.run().catch((e: unknown) => this.options.log.error(`hub: the reconnect loop stopped: ${describe(e)}`))
  }

  async stop(): Promise<void> {
    this.stopping.abort()
    await this.client?.close().catch(() => {})
  }

  get connected(): boolean {
    return this.client !== undefined
  }

  /** Waits, at most `millis`, for the first connection attempt, so a host's first tools/list is complete. */
  ready(millis: number): Promise<void> {
    return this.firstAttempt.wait(millis)
  }

  /**
   * Whether a host may start a session: waits, at most `millis`, for the first connection, and
   * answers why not when Switchboard refused the configuration or could not be reached in time.
   */
  async startup(millis: number): Promise<Refused | Unreachable | undefined> {
    await this.decided.wait(millis)
    if (this.refused !== undefined) return this.refused
    if (this.client === undefined) return new Unreachable(this.options.name, `${this.lastError}; waited ${millis} ms`)
    return undefined
  }

  /**
   * Every tool of the hub, all pages. While the hub is unreachable, the last list it gave: the host
   * keeps a steady list through a blip, and a call meanwhile says the hub is unreachable.
   */
  async tools(): Promise<ReadonlyArray<HubTool>> {
    const client = this.client
    if (client === undefined) return this.known
    try {
      const all: Array<HubTool> = []
      let cursor: string | undefined
      for (let page = 0; page < MAX_PAGES; page++) {
        const { tools, nextCursor } = await client.request(
          { method: "tools/list", params: cursor === undefined ? {} : { cursor } },
          ToolsPage,
          { timeout: CONTROL_TIMEOUT }
        )
        all.push(...tools)
        if (nextCursor === undefined || nextCursor === "") break
        cursor = nextCursor
      }
      this.known = all
      return all
    } catch (e) {
      this.options.log.warn(`hub: tools/list failed (${describe(e)}); answering with the last list`)
      return this.known
    }
  }

  /** Relays one tools/call; the host's progress and cancellation ride along in `options`. */
  async call(params: ToolCall, options: CallOptions): Promise<CallToolResult> {
    const client = this.client
    if (this.refused !== undefined) throw this.refused
    if (client === undefined) throw new Unreachable(this.options.name)
    const relayed: RequestOptions = { timeout: CALL_TIMEOUT, resetTimeoutOnProgress: true }
    if (options.signal !== undefined) relayed.signal = options.signal
    if (options.onprogress !== undefined) relayed.onprogress = options.onprogress
    try {
      return await client.request({ method: "tools/call", params: { ...params } }, CallToolResultSchema, relayed)
    } catch (e) {
      // The socket dropped mid-call: the SDK rejects what was in flight with "Connection closed".
      if (this.client !== client || (e instanceof McpError && e.code === ErrorCode.ConnectionClosed)) throw new Unreachable(this.options.name)
      if (e instanceof McpError) throw new HubRefusal(e.code, e.message, e.data)
      throw e
    }
  }

  private async run() {
    const { log } = this.options
    let connectedOnce = false
    while (!this.stopping.signal.aborted) {
      const client = new Client({ name: "switchboard-mcp", version: this.options.version })
      client.setNotificationHandler(ToolListChangedNotificationSchema, () => this.options.onToolsChanged())
      const closed = new Promise<void>((resolve) => (client.onclose = resolve))
      try {
        const transport = await HubTransport.open(this.options.url, this.options.token)
        await client.connect(transport, { timeout: CONTROL_TIMEOUT, signal: this.stopping.signal })
      } catch (e) {
        await client.close().catch(() => {})
        if (e instanceof UpgradeRefused && permanent(e.status)) {
          // Retrying would be refused the same way; the host hears why (initialize, or each call).
          this.refused = new Refused({ url: this.options.name, endpoint: this.options.url.pathname, status: e.status })
          log.error(`hub: ${this.refused.message}; not retrying until restarted with another configuration`)
          this.decided.done()
          this.firstAttempt.done()
          return
        }
        this.lastError = describe(e)
        this.firstAttempt.done()
        if (this.stopping.signal.aborted) return
        const delay = this.backoff.next()
        log.warn(`hub: cannot reach ${this.options.url.origin}${this.options.url.pathname} (${describe(e)}); reconnecting in ${delay} ms`)
        await this.pause(delay)
        continue
      }
      const since = Date.now()
      this.client = client
      log.info(`hub: ${connectedOnce ? "reconnected to" : "connected to"} ${this.options.url.origin}${this.options.url.pathname}`)
      connectedOnce = true
      this.firstAttempt.done()
      this.decided.done()
      // The host may have listed while the hub was away (or before it first answered).
      this.options.onToolsChanged()
      await closed
      this.client = undefined
      if (this.stopping.signal.aborted) return
      if (Date.now() - since >= STABLE_AFTER) this.backoff.reset()
      const delay = this.backoff.next()
      log.warn(`hub: connection to ${this.options.name} lost; reconnecting in ${delay} ms`)
      await this.pause(delay)
    }
  }

  private pause(millis: number) {
    return sleep(millis, undefined, { signal: this.stopping.signal }).catch(() => {})
  }
}
