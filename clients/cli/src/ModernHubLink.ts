/**
 * The bridge's link with the user's tool hub in MCP 2026-07-28 (Streamable HTTP at `/hub`): no
 * session, so every list and call is a request of its own and a restarted edge answers the next
 * one as if nothing happened. One `subscriptions/listen` stream stays open to hear of tool changes;
 * it is reopened with backoff whenever it breaks, and the host is told to list again then, since a
 * change may have come and gone while it was down.
 */
import { Client, ProtocolError, SdkHttpError, StreamableHTTPClientTransport } from "@modelcontextprotocol/client"
import type { CallToolResult } from "@modelcontextprotocol/server"
import { setTimeout as sleep } from "node:timers/promises"
import { Backoff } from "@switchboard/protocol/browser/Backoff"
import { MODERN } from "./HubEra.ts"
import { CALL_TIMEOUT, CONTROL_TIMEOUT, type HubLinkOptions, MAX_PAGES } from "./HubLink.ts"
import { FirstAttempt } from "./FirstAttempt.ts"
import { describe } from "./Log.ts"
import { Refused } from "./Refused.ts"
import { Unreachable } from "./Unreachable.ts"
import { type CallOptions, HubRefusal, type HubTool, ToolsPage, type ToolCall, type Upstream } from "./Upstream.ts"

/** A listen stream that lived this long resets the backoff; one that breaks at once keeps growing it. */
const STABLE_AFTER = 10_000

/** Why a request failed, with the network's own cause (`fetch failed` alone says little). */
export const reason = (e: unknown): string => {
  const cause = e instanceof Error && e.cause instanceof Error ? ` (${e.cause.message})` : ""
  return `${describe(e)}${cause}`
}

/** The protocol's reserved `_meta` keys: they describe the hub's answer (its serverInfo), not the bridge's. */
const RESERVED = "io.modelcontextprotocol/"

/** A result as the host should see it from the bridge: the hub's envelope keys taken out, its own `_meta` kept. */
const withoutEnvelope = (result: CallToolResult): CallToolResult => {
  if (result._meta === undefined) return result
  const { _meta, ...rest } = result
  const kept = Object.fromEntries(Object.entries(_meta).filter(([key]) => !key.startsWith(RESERVED)))
  return Object.keys(kept).length === 0 ? rest : { ...rest, _meta: kept }
}

export class ModernHubLink implements Upstream {
  private client: Client | undefined
  private known: ReadonlyArray<HubTool> = []
  private readonly stopping = new AbortController()
  private readonly backoff = new Backoff()
  private readonly firstAttempt = new FirstAttempt()
  /** Settles on the first connection, or on a refusal: what a host's opening request waits for. */
  private readonly decided = new FirstAttempt()
  private refused: Refused | undefined
  private lastError = "no attempt finished yet"

  /** `options.url` is the hub's HTTP URL. */
  constructor(private readonly options: HubLinkOptions) {}

  start(): void {
    this.run().catch((e: unknown) => this.options.log.error(`hub: the 2026-07-28 link stopped: ${describe(e)}`))
  }

  async stop(): Promise<void> {
    this.stopping.abort()
    await this.client?.close().catch(() => {})
  }

  ready(millis: number): Promise<void> {
    return this.firstAttempt.wait(millis)
  }

  async startup(millis: number): Promise<Refused | Unreachable | undefined> {
    await this.decided.wait(millis)
    if (this.refused !== undefined) return this.refused
    if (this.client === undefined) return new Unreachable(this.options.name, `${this.lastError}; waited ${millis} ms`)
    return undefined
  }

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
      this.options.log.warn(`hub: tools/list failed (${reason(e)}); answering with the last list`)
      return this.known
    }
  }

  /** One tools/call, one POST: its progress comes back on the call's own SSE stream, and cancelling aborts the POST. */
  async call(params: ToolCall, options: CallOptions): Promise<CallToolResult> {
    const client = this.client
    if (this.refused !== undefined) throw this.refused
    if (client === undefined) throw new Unreachable(this.options.name)
    try {
      const result = await client.request({ method: "tools/call", params: { ...params } }, {
        timeout: CALL_TIMEOUT,
        resetTimeoutOnProgress: true,
        ...(options.signal === undefined ? {} : { signal: options.signal }),
        ...(options.onprogress === undefined ? {} : { onprogress: options.onprogress })
      })
      return withoutEnvelope(result)
    } catch (e) {
      if (e instanceof ProtocolError) throw new HubRefusal(e.code, e.message, e.data)
      if (e instanceof SdkHttpError && (e.status === 401 || e.status === 403)) {
        throw new Refused({ url: this.options.name, endpoint: this.options.url.pathname, status: e.status })
      }
      if (options.signal?.aborted === true) throw e
      this.options.log.warn(`hub: tools/call ${params.name} failed (${reason(e)})`)
      throw new Unreachable(this.options.name)
    }
  }

  private async run() {
    const { log, url } = this.options
    const where = `${url.origin}${url.pathname}`
    while (!this.stopping.signal.aborted) {
      const client = new Client({ name: "switchboard-mcp", version: this.options.version }, { versionNegotiation: { mode: { pin: MODERN } } })
      client.setNotificationHandler("notifications/tools/list_changed", () => this.options.onToolsChanged())
      const transport = new StreamableHTTPClientTransport(url, { requestInit: { headers: { Authorization: `Bearer ${this.options.token}` } } })
      try {
        await client.connect(transport, { timeout: CONTROL_TIMEOUT, signal: this.stopping.signal })
      } catch (e) {
        await client.close().catch(() => {})
        if (e instanceof SdkHttpError && (e.status === 401 || e.status === 403)) {
          this.refused = new Refused({ url: this.options.name, endpoint: url.pathname, status: e.status })
          log.error(`hub: ${this.refused.message}; not retrying until restarted with another configuration`)
          this.decided.done()
          this.firstAttempt.done()
          return
        }
        this.lastError = reason(e)
        this.firstAttempt.done()
        if (this.stopping.signal.aborted) return
        const delay = this.backoff.next()
        log.warn(`hub: cannot reach ${where} (${this.lastError}); trying again in ${delay} ms`)
        await this.pause(delay)
        continue
      }
      this.client = client
      this.backoff.reset()
      log.info(`hub: MCP ${MODERN} (Streamable HTTP, no session) at ${where}`)
      this.firstAttempt.done()
      this.decided.done()
      // The host may have listed before the hub first answered.
      this.options.onToolsChanged()
      return this.listen(client, where)
    }
  }

  /** Keeps one subscriptions/listen stream open for tool changes, for as long as the bridge runs. */
  private async listen(client: Client, where: string) {
    const { log } = this.options
    let reopening = false
    while (!this.stopping.signal.aborted) {
      const since = Date.now()
      let why: string
      try {
        const subscription = await client.listen({ toolsListChanged: true }, { signal: this.stopping.signal, timeout: CONTROL_TIMEOUT })
        if (reopening) {
          log.info(`hub: reconnected to ${where} (subscriptions/listen)`)
          // A change may have come and gone while the stream was down.
          this.options.onToolsChanged()
        }
        why = String(await subscription.closed)
      } catch (e) {
        why = reason(e)
      }
      if (this.stopping.signal.aborted) return
      if (Date.now() - since >= STABLE_AFTER) this.backoff.reset()
      const delay = this.backoff.next()
      // Calls need no standing connection in this era; only change notifications wait for the reopen.
      log.warn(`hub: connection to ${this.options.name} lost; reconnecting in ${delay} ms (the subscriptions/listen stream ended: ${why})`)
      reopening = true
      await this.pause(delay)
    }
  }

  private pause(millis: number) {
    return sleep(millis, undefined, { signal: this.stopping.signal }).catch(() => {})
  }
}
