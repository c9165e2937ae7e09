/**
 * The service worker's half of the MCP-B bridge: one `/tabs` socket per tab whose page serves MCP,
 * opened when the tab's content script first reports tools. It authenticates with a first
 * `authenticate` message rather than a token in the URL, which proxies log, says `browser/hello` with the tab's
 * real id, url and title (from `chrome.tabs`, never from the page), relays the page's tools, carries
 * `browser/executeTool` (and its cancellation) to the page and its progress and result back, and
 * tells the registry when the tab is activated. The socket closes with the tab or its page; it
 * comes back with backoff if it drops.
 */
import { Backoff } from "@switchboard/protocol/browser/Backoff"
import * as JsonRpc from "@switchboard/protocol/browser/JsonRpc"
import * as Registry from "@switchboard/protocol/browser/Registry"
// Types only: erased from the bundle, so the Schemas behind them stay out of it.
import type { AuthenticateParams, Hello, RegisterTools } from "@switchboard/protocol/Registry"
import * as Settings from "./Settings.ts"
import { type FromPage, type PageTool, PortName, type ToPage } from "./Wire.ts"

export interface TabState {
  readonly tabId: number
  readonly url: string | undefined
  readonly title: string | undefined
  readonly tools: ReadonlyArray<string>
  readonly connected: boolean
}

class TabLink {
  private socket: WebSocket | undefined
  private retry: ReturnType<typeof setTimeout> | undefined
  /** 500 ms doubling to 30 s: a browser's sockets are many per server, and nobody waits on them. */
  private readonly backoff = new Backoff({ initialMillis: 500, maxMillis: 30_000 })
  private tools: ReadonlyArray<PageTool> | undefined
  /** Whether this socket has registered the tools once (then changes are updateTools). */
  private registered = false
  private closed = false
  /** The registry's progress token of each call under way that asked for progress. */
  private readonly progressTokens = new Map<JsonRpc.Id, string | number>()
  url: string | undefined
  title: string | undefined

  constructor(
    readonly tabId: number,
    private readonly port: chrome.runtime.Port
  ) {}

  fromPage(message: FromPage) {
    if (message.type === "tools") {
      this.tools = message.tools
      if (this.socket === undefined) {
        if (this.retry === undefined) void this.open()
      } else if (this.socket.readyState === WebSocket.OPEN) this.relayTools()
    } else if (message.type === "result") {
      this.progressTokens.delete(message.id)
      const answer: Registry.ExecuteResult = { success: message.success, payload: message.payload }
      this.send(JsonRpc.result(message.id, answer))
    } else {
      const progressToken = this.progressTokens.get(message.id)
      if (progressToken === undefined) return
      const { type: _type, id: _id, ...progress } = message
      this.send(JsonRpc.notification("notifications/progress", { ...progress, progressToken }))
    }
  }

  activated() {
    this.send(JsonRpc.notification(Registry.Method.activated, {}))
  }

  /** The page changed its url without a new document (history API): the registry keeps the latest. */
  async moved() {
    if (this.socket?.readyState === WebSocket.OPEN) await this.hello()
  }

  state(): TabState {
    return {
      tabId: this.tabId,
      url: this.url,
      title: this.title,
      tools: (this.tools ?? []).map((t) => t.name),
      connected: this.socket?.readyState === WebSocket.OPEN && this.registered
    }
  }

  close() {
    this.closed = true
    if (this.retry !== undefined) clearTimeout(this.retry)
    this.socket?.close(1000, "tab closed")
    this.socket = undefined
  }

  /** Settings changed: a new socket with the new server or token. */
  reopen() {
    if (this.closed) return
    if (this.retry !== undefined) clearTimeout(this.retry)
    this.retry = undefined
    const old = this.socket
    this.socket = undefined
    old?.close(1000, "settings changed")
    this.backoff.reset()
    if (this.tools !== undefined) void this.open()
  }

  private send(text: string) {
    if (this.socket?.readyState === WebSocket.OPEN) this.socket.send(text)
  }

  private relayTools() {
    const method = this.registered ? Registry.Method.updateTools : Registry.Method.registerTools
    this.registered = true
    const params: RegisterTools = { tools: this.tools ?? [], ...(this.url === undefined ? {} : { tabUrl: this.url }) }
    this.send(JsonRpc.notification(method, params))
  }

  private async hello() {
    const tab = await chrome.tabs.get(this.tabId).catch(() => undefined)
    if (tab === undefined) return this.close()
    this.url = tab.url
    this.title = tab.title
    const params: Hello = { tabId: this.tabId, url: tab.url ?? "", ...(tab.title === undefined ? {} : { title: tab.title }), active: tab.active }
    this.send(JsonRpc.notification(Registry.Method.hello, params))
  }

  private async open() {
    const settings = await Settings.read()
    if (this.closed || this.socket !== undefined) return
    if (settings.serverUrl === undefined || settings.token === undefined) return
    const url = Settings.socketUrl(settings.serverUrl, "/tabs")
    if (typeof url === "string") return
    // The registry takes http(s) pages only; any other would be refused again on every retry.
    const tab = await chrome.tabs.get(this.tabId).catch(() => undefined)
    if (tab?.url === undefined || !/^https?:/.test(tab.url) || this.closed || this.socket !== undefined) return
    const token = settings.token
    const ws = new WebSocket(url)
    this.socket = ws
    this.registered = false
    ws.onopen = () => {
      // On this socket, first: the registry acts on nothing before it. A notification, so no answer
      // resets the backoff; a refused token closes with 1008 and is retried like any other drop.
      const params: AuthenticateParams = { token }
      ws.send(JsonRpc.notification(Registry.Authenticate, params))
      void this.hello().then(() => {
        if (this.socket === ws) this.relayTools()
      })
    }
    ws.onmessage = (event) => {
      if (typeof event.data === "string") this.fromHub(event.data)
    }
    ws.onclose = () => {
      if (this.socket !== ws) return
      this.socket = undefined
      this.registered = false
      if (this.closed) return
      this.retry = setTimeout(() => {
        this.retry = undefined
        void this.open()
      }, this.backoff.next())
    }
  }

  private fromHub(text: string) {
    let message: unknown
    try {
      message = JSON.parse(text)
    } catch {
      return
    }
    if (!JsonRpc.isRecord(message)) return
    const id = message["id"]
    const params = message["params"]
    if (message["method"] === Registry.Method.executeTool && JsonRpc.isId(id) && JsonRpc.isRecord(params)) {
      const toolName = params["toolName"]
      if (typeof toolName !== "string") return this.send(JsonRpc.result(id, { success: false, payload: `${Registry.Method.executeTool} without toolName` } satisfies Registry.ExecuteResult))
      const args = JsonRpc.isRecord(params["args"]) ? params["args"] : {}
      const meta = params["_meta"]
      const progressToken = JsonRpc.isRecord(meta) ? meta["progressToken"] : undefined
      const progress = typeof progressToken === "string" || typeof progressToken === "number"
      if (progress) this.progressTokens.set(id, progressToken)
      this.toPage({ type: "execute", id, toolName, args, progress })
    } else if (message["method"] === "notifications/cancelled" && JsonRpc.isRecord(params)) {
      const requestId = params["requestId"]
      if (!JsonRpc.isId(requestId)) return
      this.progressTokens.delete(requestId)
      this.toPage({ type: "cancel", id: requestId, ...(typeof params["reason"] === "string" ? { reason: params["reason"] } : {}) })
    } else if (!("method" in message)) {
      // The answer to hello or registerTools: a good one resets the backoff.
      if ("result" in message) this.backoff.reset()
    }
  }

  private toPage(message: ToPage) {
    try {
      this.port.postMessage(message)
    } catch {
      if (message.type === "execute") {
        this.send(JsonRpc.result(message.id, { success: false, payload: `tab ${this.tabId} went away before the call reached it` } satisfies Registry.ExecuteResult))
      }
    }
  }
}

const links = new Map<number, TabLink>()

export const state = (): ReadonlyArray<TabState> => [...links.values()].map((l) => l.state())

export const reopenAll = () => {
  for (const link of links.values()) link.reopen()
}

const isFromPage = (u: unknown): u is FromPage =>
  JsonRpc.isRecord(u) &&
  ((u["type"] === "tools" && Array.isArray(u["tools"])) ||
    (u["type"] === "result" && Registry.isExecuteResult(u)) ||
    (u["type"] === "progress" && typeof u["progress"] === "number"))

export const start = () => {
  chrome.runtime.onConnect.addListener((port) => {
    if (port.name !== PortName) return
    const tabId = port.sender?.tab?.id
    // Only a tab's top frame speaks for the tab.
    if (tabId === undefined || port.sender?.frameId !== 0) return port.disconnect()
    links.get(tabId)?.close()
    const link = new TabLink(tabId, port)
    links.set(tabId, link)
    port.onMessage.addListener((message: unknown) => {
      if (isFromPage(message)) link.fromPage(message)
    })
    port.onDisconnect.addListener(() => {
      link.close()
      if (links.get(tabId) === link) links.delete(tabId)
    })
  })
  chrome.tabs.onActivated.addListener(({ tabId }) => links.get(tabId)?.activated())
  chrome.tabs.onUpdated.addListener((tabId, info) => {
    if (info.url !== undefined || info.title !== undefined) void links.get(tabId)?.moved()
  })
}
