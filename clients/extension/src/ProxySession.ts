/**
 * The extension role of the MCP Proxy Protocol on `/extension`: connect, wait for the proxy's
 * `authenticate` and answer it with the stored token and this profile's client id, then answer
 * every forwarded request with the same id. The socket comes back with backoff whenever it drops;
 * the proxy's `status` every 20 s keeps the service worker awake, and an alarm is the floor.
 */
import { Backoff } from "@switchboard/protocol/browser/Backoff"
import * as Cdp from "@switchboard/protocol/browser/Cdp"
import * as JsonRpc from "@switchboard/protocol/browser/JsonRpc"
// Types only: erased from the bundle, so the Schemas behind them stay out of it.
import type * as Proxy from "@switchboard/protocol/Proxy"
import * as BrowserControl from "./BrowserControl.ts"
import * as Debugger from "./Debugger.ts"
import * as Settings from "./Settings.ts"
import { errorOf, type Json } from "./Wire.ts"

export interface ProxyState {
  readonly state: "unconfigured" | "connecting" | "authenticated" | "disconnected"
  readonly server?: string
  readonly extensionId?: string
  readonly userId?: string
  /** Why the last socket closed, or why none can open. */
  readonly reason?: string
  readonly since: number
}

export class ProxySession {
  private socket: WebSocket | undefined
  private retry: ReturnType<typeof setTimeout> | undefined
  /** 500 ms doubling to 30 s: a browser's sockets are many per server, and nobody waits on them. */
  private readonly backoff = new Backoff({ initialMillis: 500, maxMillis: 30_000 })
  /** Bumped by every restart, so a connect that was under way when settings changed gives up. */
  private generation = 0
  state: ProxyState = { state: "unconfigured", since: Date.now() }

  constructor() {
    // The events of tabs a CDP client drives go to the router on whichever socket is open then.
    Debugger.onEvent((event) => this.socket === undefined || send(this.socket, JsonRpc.notification(Cdp.Method.event, event)))
  }

  /** Drops the socket and connects again with the current settings. */
  restart(): Promise<void> {
    this.generation++
    this.backoff.reset()
    this.stop()
    return this.connect()
  }

  /** Connects unless a socket is open or a reconnect is scheduled (the alarm's check). */
  ensure(): Promise<void> {
    return this.socket === undefined && this.retry === undefined ? this.connect() : Promise.resolve()
  }

  private stop() {
    if (this.retry !== undefined) clearTimeout(this.retry)
    this.retry = undefined
    const old = this.socket
    this.socket = undefined
    old?.close(1000, "settings changed")
  }

  private set(state: Omit<ProxyState, "since">) {
    this.state = { ...state, since: Date.now() }
  }

  private async connect(): Promise<void> {
    const generation = this.generation
    const settings = await Settings.read()
    if (generation !== this.generation || this.socket !== undefined) return
    if (settings.serverUrl === undefined || settings.token === undefined) {
      return this.set({ state: "unconfigured", reason: `set ${Settings.Keys.serverUrl} and ${Settings.Keys.token} (popup or chrome.storage)` })
    }
    const url = Settings.socketUrl(settings.serverUrl, "/extension")
    if (typeof url === "string") return this.set({ state: "unconfigured", reason: url })
    const clientId = await Settings.clientId()
    if (generation !== this.generation || this.socket !== undefined) return
    const server = settings.serverUrl
    this.set({ state: "connecting", server })
    const ws = new WebSocket(url)
    this.socket = ws
    ws.onmessage = (event) => {
      if (typeof event.data === "string") this.onMessage(ws, event.data, settings, clientId, server)
    }
    ws.onclose = (event) => {
      if (this.socket !== ws) return
      this.socket = undefined
      const reason = event.reason !== "" ? `${event.code} ${event.reason}` : `closed with ${event.code}`
      this.set({ state: "disconnected", server, reason })
      const delay = this.backoff.next()
      this.retry = setTimeout(() => {
        this.retry = undefined
        void this.connect()
      }, delay)
    }
  }

  private onMessage(ws: WebSocket, text: string, settings: Settings.Settings, clientId: string, server: string) {
    let message: unknown
    try {
      message = JSON.parse(text)
    } catch {
      return
    }
    if (!JsonRpc.isRecord(message) || typeof message["method"] !== "string") return // responses: the extension sends no requests
    const method = message["method"]
    const params = JsonRpc.isRecord(message["params"]) ? message["params"] : {}
    const id = message["id"]
    if (!JsonRpc.isId(id)) {
      if (method === "authenticated") {
        this.backoff.reset()
        this.set({
          state: "authenticated",
          server,
          ...(typeof params["extension_id"] === "string" ? { extensionId: params["extension_id"] } : {}),
          ...(typeof params["user_id"] === "string" ? { userId: params["user_id"] } : {})
        })
      }
      return // `status` and anything else: receiving it already kept the worker awake
    }
    if (method === "authenticate") {
      const answer: Proxy.AuthenticateAnswer = { name: settings.name, ...(settings.token === undefined ? {} : { accessToken: settings.token }), client_id: clientId }
      return ws.send(JsonRpc.result(id, answer))
    }
    this.answer(ws, id, method, params)
  }

  private answer(ws: WebSocket, id: JsonRpc.Id, method: string, params: Json) {
    BrowserControl.handle(method, params).then(
      // A method that returns nothing still answers with a result: `{}`.
      (value) => send(ws, JsonRpc.result(id, value ?? {})),
      (e: unknown) => {
        const { code, message } = errorOf(e)
        send(ws, JsonRpc.failure(id, code, message))
      }
    )
  }
}

/** A socket that closed meanwhile takes the answer nowhere; the proxy answered the client already. */
const send = (ws: WebSocket, text: string) => {
  if (ws.readyState === WebSocket.OPEN) ws.send(text)
}
