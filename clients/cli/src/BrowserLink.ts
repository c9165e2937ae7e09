/**
 * The bridge as an MCP client of the MCP Proxy Protocol (`/mcp`): `mcp_handshake`, then
 * `list_extensions` and `connect` to the user's chosen extension, then forwarded requests. The
 * socket is kept up with backoff; the extension is attached when the socket opens and again on the
 * next call after it went away (`disconnected`), so a browser that restarts is picked up.
 */
import { Backoff } from "@switchboard/protocol/browser/Backoff"
import * as JsonRpc from "@switchboard/protocol/JsonRpc"
import * as Proxy from "@switchboard/protocol/Proxy"
import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { setTimeout as sleep } from "node:timers/promises"
import { JsonRpcSocket, RpcError, SocketClosed } from "./JsonRpcSocket.ts"
import { describe, type Log } from "./Log.ts"
import * as Socket from "./Socket.ts"
import { FirstAttempt } from "./FirstAttempt.ts"
import { Unreachable } from "./Unreachable.ts"

/** The proxy's own answers, and the extension's through it, may take this long (the router's default is 120 s). */
const FORWARD_TIMEOUT = 150_000
const CONTROL_TIMEOUT = 10_000
const STABLE_AFTER = 10_000

/** No extension to forward to; the message says why, for the host's model to read. */
export class NoExtension extends Error {}

interface Attached {
  readonly connectionId: string
  readonly extensionId: string
  readonly name: string
}

export interface BrowserLinkOptions {
  readonly url: URL
  /** The base URL the user gave, for messages. */
  readonly name: string
  readonly token: string
  /** An extension id or name; unset picks the only one, or the first listed. */
  readonly extension: string | undefined
  readonly log: Log
}

const decode = <A, I>(schema: Schema.Schema<A, I>, what: string, u: unknown): A =>
  Either.getOrThrowWith(Schema.decodeUnknownEither(schema)(u), () => new Error(`the proxy's answer to ${what} was malformed`))

export class BrowserLink {
  private rpc: JsonRpcSocket | undefined
  private attached: Attached | undefined
  private attaching: Promise<Attached> | undefined
  /** Why the last extension went away, until one is attached again. */
  private lost: string | undefined
  private readonly stopping = new AbortController()
  private readonly backoff = new Backoff()
  private readonly firstAttempt = new FirstAttempt()

  constructor(private readonly options: BrowserLinkOptions) {}

  /** Waits, at most `millis`, for the first connection attempt, so a host's first call finds the proxy. */
  ready(millis: number): Promise<void> {
    return this.firstAttempt.wait(millis)
  }

  start(): void {
    this.run().catch((e: unknown) => this.options.log.error(`browser: the reconnect loop stopped: ${describe(e)}`))
  }

  stop(): void {
    this.stopping.abort()
    this.rpc?.close()
  }

  /** Forwards `method` to the attached extension, attaching first when none is. */
  async request(method: string, params: Record<string, unknown>, signal?: AbortSignal): Promise<unknown> {
    for (let attempt = 0; ; attempt++) {
      const rpc = this.rpc
      if (rpc === undefined) throw new Unreachable(this.options.name)
      const attached = this.attached ?? (await this.attach(rpc))
      try {
        return await rpc.request(method, params, { timeoutMillis: FORWARD_TIMEOUT, ...(signal === undefined ? {} : { signal }) })
      } catch (e) {
        if (e instanceof SocketClosed) throw new Unreachable(this.options.name)
        // The proxy ended our session (the extension left) before its `disconnected` reached us.
        if (e instanceof RpcError && e.message === Proxy.NotConnected && attempt === 0) {
          if (this.attached === attached) this.attached = undefined
          continue
        }
        throw e
      }
    }
  }

  private attach(rpc: JsonRpcSocket): Promise<Attached> {
    this.attaching ??= this.choose(rpc).finally(() => (this.attaching = undefined))
    return this.attaching
  }

  private async choose(rpc: JsonRpcSocket): Promise<Attached> {
    const { log } = this.options
    const { extensions } = decode(Proxy.ExtensionsResult, "list_extensions", await this.control(rpc, "list_extensions", {}))
    const wanted = this.options.extension
    const lost = this.lost === undefined ? "" : ` (the last one went away: ${this.lost})`
    const listed = extensions.map((e) => `${e.name} (${e.id})`).join(", ")
    const chosen = wanted === undefined ? extensions[0] : (extensions.find((e) => e.id === wanted) ?? extensions.find((e) => e.name === wanted))
    if (chosen === undefined) {
      throw new NoExtension(
        wanted === undefined || extensions.length === 0
          ? `no browser extension is connected for this user${lost}`
          : `browser extension ${JSON.stringify(wanted)} is not connected for this user; connected: ${listed}${lost}`
      )
    }
    if (wanted === undefined && extensions.length > 1) {
      log.warn(`browser: ${extensions.length} extensions are connected (${listed}); using the first, ${chosen.name} (pass --extension to choose)`)
    }
    const answer = await this.control(rpc, "connect", { extension_id: chosen.id }).catch(async (e: unknown) => {
      // -32001: still attached on the proxy's side (a `disconnected` we missed); detach and retry.
      if (!(e instanceof RpcError) || e.code !== JsonRpc.ErrorCode.ServerError1) throw e
      await this.control(rpc, "disconnect", {})
      return this.control(rpc, "connect", { extension_id: chosen.id })
    })
    const connected = decode(Proxy.ConnectResult, "connect", answer)
    const attached = { connectionId: connected.connection_id, extensionId: connected.extension_id, name: connected.extension_name ?? chosen.name }
    if (this.rpc === rpc) {
      this.attached = attached
      this.lost = undefined
      log.info(`browser: connected to extension ${attached.name} (${attached.extensionId})`)
    }
    return attached
  }

  private control(rpc: JsonRpcSocket, method: string, params: object) {
    return rpc.request(method, params, { timeoutMillis: CONTROL_TIMEOUT }).catch((e: unknown) => {
      if (e instanceof SocketClosed) throw new Unreachable(this.options.name)
      if (e instanceof RpcError && method === "connect" && e.code !== JsonRpc.ErrorCode.ServerError1) throw new NoExtension(`could not connect to the browser extension: ${e.message}`)
      throw e
    })
  }

  private onNotification(rpc: JsonRpcSocket, method: string, params: unknown) {
    if (method !== "disconnected") return // `status` keepalives, and anything newer
    const notice = Schema.decodeUnknownOption(Proxy.DisconnectedParams)(params)
    if (notice._tag === "None" || this.rpc !== rpc || this.attached?.connectionId !== notice.value.connection_id) return
    const reason = notice.value.reason ?? "no reason given"
    this.options.log.warn(`browser: extension ${this.attached.name} disconnected (${reason}); the next browser tool call connects again`)
    this.lost = `${this.attached.name}: ${reason}`
    this.attached = undefined
  }

  private async run() {
    const { log, url } = this.options
    let connectedOnce = false
    while (!this.stopping.signal.aborted) {
      let rpc: JsonRpcSocket | undefined
      try {
        const socket = await Socket.open(url, {})
        Socket.keepAlive(socket)
        const opened: JsonRpcSocket = new JsonRpcSocket(socket, (method, params) => this.onNotification(opened, method, params))
        rpc = opened
        decode(Proxy.HandshakeResult, "mcp_handshake", await rpc.request("mcp_handshake", { accessToken: this.options.token }, { timeoutMillis: CONTROL_TIMEOUT }))
      } catch (e) {
        rpc?.close()
        this.firstAttempt.done()
        if (this.stopping.signal.aborted) return
        const delay = this.backoff.next()
        log.warn(`browser: cannot reach ${url.origin}${url.pathname} (${describe(e)}); reconnecting in ${delay} ms`)
        await this.pause(delay)
        continue
      }
      const since = Date.now()
      this.rpc = rpc
      log.info(`browser: ${connectedOnce ? "reconnected to" : "connected to"} ${url.origin}${url.pathname}`)
      connectedOnce = true
      this.firstAttempt.done()
      this.attach(rpc).catch((e: unknown) => log.info(`browser: ${describe(e)}; browser tools will try again when called`))
      const why = await rpc.closed
      this.rpc = undefined
      this.attached = undefined
      if (this.stopping.signal.aborted) return
      if (Date.now() - since >= STABLE_AFTER) this.backoff.reset()
      const delay = this.backoff.next()
      log.warn(`browser: connection to ${this.options.name} lost (${why}); reconnecting in ${delay} ms`)
      await this.pause(delay)
    }
  }

  private pause(millis: number) {
    return sleep(millis, undefined, { signal: this.stopping.signal }).catch(() => {})
  }
}
