/**
 * An MCP client of the page's own server over the `@mcp-b/transports` tab envelope, as the content
 * script runs it. It accepts only what the page's own window posts from the page's own origin, and
 * its ids carry a random prefix: every client on the channel sees every reply, so ids that aren't
 * ours are someone else's.
 */
import * as JsonRpc from "@switchboard/protocol/browser/JsonRpc"
import { envelope, envelopeOf, fromOwnWindow, type Json, type Progress } from "./Wire.ts"

const CALL_TIMEOUT = 120_000
const PROTOCOL_VERSION = "2025-06-18"

interface Pending {
  readonly resolve: (value: Json) => void
  readonly reject: (e: Error) => void
  readonly timer: ReturnType<typeof setTimeout>
  readonly onProgress?: (progress: Progress) => void
}

export interface CallOptions {
  /** Asks the page for progress (its token is the request's own id) and hands each report here. */
  readonly onProgress?: (progress: Progress) => void
  /** Aborting it sends the page `notifications/cancelled`. */
  readonly signal?: AbortSignal
}

export class PageClient {
  private readonly prefix = `switchboard-${crypto.randomUUID()}:`
  private seq = 0
  private readonly pending = new Map<JsonRpc.Id, Pending>()
  private readonly listener = (event: MessageEvent) => this.onMessage(event)

  constructor(
    readonly channel: string,
    private readonly onToolsChanged: () => void
  ) {
    window.addEventListener("message", this.listener)
  }

  /** initialize + initialized: the page's server answers nothing else before. */
  async initialize(): Promise<void> {
    await this.request("initialize", {
      protocolVersion: PROTOCOL_VERSION,
      capabilities: {},
      clientInfo: { name: "switchboard-extension", version: "0.1.0" }
    })
    this.post({ jsonrpc: "2.0", method: "notifications/initialized" })
  }

  /** Every tool the page lists, following pagination. */
  async listTools(): Promise<Array<Json & { name: string }>> {
    const tools: Array<Json & { name: string }> = []
    let cursor: string | undefined
    for (let page = 0; page < 100; page++) {
      const answer = await this.request("tools/list", cursor === undefined ? {} : { cursor })
      const list = answer["tools"]
      if (Array.isArray(list)) for (const t of list) if (JsonRpc.isRecord(t) && typeof t["name"] === "string") tools.push(t as Json & { name: string })
      cursor = typeof answer["nextCursor"] === "string" ? answer["nextCursor"] : undefined
      if (cursor === undefined) break
    }
    return tools
  }

  callTool(name: string, args: Json, options: CallOptions = {}): Promise<Json> {
    return this.request("tools/call", { name, arguments: args }, options)
  }

  close() {
    window.removeEventListener("message", this.listener)
    for (const p of this.pending.values()) {
      clearTimeout(p.timer)
      p.reject(new Error("the page's MCP server went away"))
    }
    this.pending.clear()
  }

  private post(payload: unknown) {
    window.postMessage(envelope(this.channel, "client-to-server", payload), window.location.origin)
  }

  private request(method: string, params: Json, options: CallOptions = {}): Promise<Json> {
    const id = `${this.prefix}${++this.seq}`
    const { onProgress, signal } = options
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id)
        reject(new Error(`the page did not answer ${method} within ${CALL_TIMEOUT / 1000} s`))
      }, CALL_TIMEOUT)
      this.pending.set(id, { resolve, reject, timer, ...(onProgress === undefined ? {} : { onProgress }) })
      signal?.addEventListener(
        "abort",
        () => {
          if (!this.pending.delete(id)) return
          clearTimeout(timer)
          this.post({ jsonrpc: "2.0", method: "notifications/cancelled", params: { requestId: id, ...(typeof signal.reason === "string" ? { reason: signal.reason } : {}) } })
          reject(new Error("cancelled"))
        },
        { once: true }
      )
      this.post({ jsonrpc: "2.0", id, method, params: onProgress === undefined ? params : { ...params, _meta: { progressToken: id } } })
    })
  }

  private onProgress(params: unknown) {
    if (!JsonRpc.isRecord(params) || typeof params["progress"] !== "number") return
    const token = params["progressToken"]
    const pending = typeof token === "string" ? this.pending.get(token) : undefined
    pending?.onProgress?.({
      progress: params["progress"],
      ...(typeof params["total"] === "number" ? { total: params["total"] } : {}),
      ...(typeof params["message"] === "string" ? { message: params["message"] } : {})
    })
  }

  private onMessage(event: MessageEvent) {
    if (!fromOwnWindow(event)) return
    const message = envelopeOf(event.data, this.channel, "server-to-client")?.payload
    if (!JsonRpc.isRecord(message)) return
    if (message["method"] === "notifications/tools/list_changed") return this.onToolsChanged()
    if (message["method"] === "notifications/progress") return this.onProgress(message["params"])
    const id = message["id"]
    if (typeof id !== "string" || !id.startsWith(this.prefix)) return
    const pending = this.pending.get(id)
    if (pending === undefined) return
    this.pending.delete(id)
    clearTimeout(pending.timer)
    const error = message["error"]
    if (JsonRpc.isRecord(error)) pending.reject(new Error(typeof error["message"] === "string" ? error["message"] : "the page answered with an error"))
    else pending.resolve(JsonRpc.isRecord(message["result"]) ? message["result"] : {})
  }
}
