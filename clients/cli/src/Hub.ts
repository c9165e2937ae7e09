/**
 * The bridge's link to the user's tool hub, in the best era the hub offers: it asks with
 * `server/discover` first and speaks 2026-07-28 over Streamable HTTP when offered (a restarted edge
 * then costs nothing), or keeps today's legacy WebSocket session with a hub that answers as a legacy
 * one would. Until the hub has answered, it retries with backoff like the links themselves do.
 */
import type { CallToolResult } from "@modelcontextprotocol/server"
import { setTimeout as sleep } from "node:timers/promises"
import { Backoff } from "@switchboard/protocol/browser/Backoff"
import { FirstAttempt } from "./FirstAttempt.ts"
import { probe } from "./HubEra.ts"
import { HubLink, type HubLinkOptions } from "./HubLink.ts"
import { describe } from "./Log.ts"
import { reason, ModernHubLink } from "./ModernHubLink.ts"
import { Refused } from "./Refused.ts"
import { Unreachable } from "./Unreachable.ts"
import type { CallOptions, HubTool, ToolCall, Upstream } from "./Upstream.ts"

export interface HubOptions extends Omit<HubLinkOptions, "url"> {
  /** `/hub` over WebSocket, the legacy era's link. */
  readonly wsUrl: URL
  /** `/hub` over HTTP, where the 2026-07-28 era is asked for and spoken. */
  readonly httpUrl: URL
}

export class Hub implements Upstream {
  private link: Upstream | undefined
  private refused: Refused | undefined
  private lastError = "no attempt finished yet"
  /** Settles once the era is chosen, or Switchboard refused the configuration. */
  private readonly chosen = new FirstAttempt()
  /** Settles when the first probe is over, however it went. */
  private readonly firstAttempt = new FirstAttempt()
  private readonly stopping = new AbortController()
  private readonly backoff = new Backoff()

  constructor(private readonly options: HubOptions) {}

  start(): void {
    this.choose().catch((e: unknown) => this.options.log.error(`hub: choosing the era stopped: ${describe(e)}`))
  }

  async stop(): Promise<void> {
    this.stopping.abort()
    await this.link?.stop()
  }

  async ready(millis: number): Promise<void> {
    const started = Date.now()
    await Promise.race([this.chosen.wait(millis), this.firstAttempt.wait(millis)])
    await this.link?.ready(Math.max(0, millis - (Date.now() - started)))
  }

  async startup(millis: number): Promise<Refused | Unreachable | undefined> {
    const started = Date.now()
    await this.chosen.wait(millis)
    if (this.refused !== undefined) return this.refused
    if (this.link === undefined) return new Unreachable(this.options.name, `${this.lastError}; waited ${millis} ms`)
    return this.link.startup(Math.max(0, millis - (Date.now() - started)))
  }

  tools(): Promise<ReadonlyArray<HubTool>> {
    return this.link?.tools() ?? Promise.resolve([])
  }

  call(params: ToolCall, options: CallOptions): Promise<CallToolResult> {
    if (this.refused !== undefined) return Promise.reject(this.refused)
    if (this.link === undefined) return Promise.reject(new Unreachable(this.options.name))
    return this.link.call(params, options)
  }

  private async choose() {
    const { httpUrl, log, wsUrl } = this.options
    while (!this.stopping.signal.aborted) {
      try {
        const era = await probe(httpUrl, this.options.token, this.options.version, this.stopping.signal, this.options.name)
        if (era._tag === "Modern") {
          this.link = new ModernHubLink({ ...this.options, url: httpUrl })
        } else {
          log.info(`hub: ${era.why}; speaking the legacy era over WebSocket at ${wsUrl.origin}${wsUrl.pathname}`)
          this.link = new HubLink({ ...this.options, url: wsUrl })
        }
        this.link.start()
        this.chosen.done()
        return
      } catch (e) {
        if (e instanceof Refused) {
          this.refused = e
          log.error(`hub: ${e.message}; not retrying until restarted with another configuration`)
          this.chosen.done()
          this.firstAttempt.done()
          return
        }
        this.lastError = reason(e)
        this.firstAttempt.done()
        if (this.stopping.signal.aborted) return
        const delay = this.backoff.next()
        log.warn(`hub: cannot reach ${httpUrl.origin}${httpUrl.pathname} (${this.lastError}); reconnecting in ${delay} ms`)
        await sleep(delay, undefined, { signal: this.stopping.signal }).catch(() => {})
      }
    }
  }
}
