/**
 * The actor of a CDP client's socket (`/cdp/{extension_id}`): Playwright's `connectOverCDP`,
 * Puppeteer's `connect` and the MCP servers built on them drive the user's own browser through
 * the extension, as one more client of the router. The client speaks the Chrome DevTools Protocol
 * with flattened sessions; the extension can only give page-level CDP (`chrome.debugger`), so the
 * browser target is emulated here: `Target.*` maps onto the extension's tabs, each tab this client
 * opened is a page session of its own, and the tab's CDP events come back through the extension's
 * `forwardCDPEvent` (`@switchboard/protocol/browser/Cdp`). A client drives only the tabs it
 * opened; the extension refuses a tab another client drives.
 */
import { Actors, TimedMap } from "@switchboard/bus"
import { Edge, type Proxy } from "@switchboard/protocol"
import * as Cdp from "@switchboard/protocol/browser/Cdp"
import { isRecord } from "@switchboard/protocol/JsonRpc"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import * as Attachment from "./Attachment.ts"
import type { Replica } from "./Replica.ts"

/** The path of the endpoint, whose last segment is the extension's id. */
export const PREFIX = "/cdp/"
export const serves = (path: string) => path.startsWith(PREFIX)

/** CDP's own error codes, as Chrome answers them. */
const ServerError = -32000
const MethodNotFound = -32601
const InvalidParams = -32602
const InvalidRequest = -32600

/** The one browser context of the user's browser, as clients see it. */
const CONTEXT = "switchboard-user-browser"

type Params = Record<string, unknown>
type Answer = { readonly result: unknown } | { readonly error: { readonly code: number; readonly message: string } }

/** A tab this client opened, as a page target with its session. */
interface Page {
  readonly tabId: number
  readonly sessionId: string
  info: Cdp.TargetInfo
}

const unsupported = (method: string): Answer => ({
  error: { code: MethodNotFound, message: `'${method}' wasn't found: Switchboard's CDP endpoint emulates the browser target over the extension's tabs` }
})
const failed = (message: string, code = ServerError): Answer => ({ error: { code, message } })

class CdpClient {
  private readonly pages = new Map<string, Page>()
  private readonly byTab = new Map<number, Page>()
  /** Child targets (iframes, workers) Chrome attached in a tab, by their session id. */
  private readonly children = new Map<string, number>()
  private autoAttach = false
  private discover = false
  private sequence = 0

  constructor(
    private readonly conn: Actors.Connection,
    private readonly session: Attachment.Session,
    /** The extension's answers awaited, by mapped id. */
    private readonly waiting: TimedMap<string, (answer: Answer) => void>,
    private readonly maxPending: number
  ) {}

  private send(message: object) {
    this.conn.send(JSON.stringify(message))
  }

  private answer(id: number, sessionId: string | undefined, answer: Answer) {
    this.send({ id, ...(sessionId === undefined ? {} : { sessionId }), ...answer })
  }

  /** One method of the extension; `then` gets its result or error. */
  private ask(method: string, params: Params, then: (answer: Answer) => void) {
    if (this.waiting.size >= this.maxPending) return then(failed(`Too many pending commands (limit ${this.maxPending})`))
    const mapped = `${this.session.connectionId}:cdp-${++this.sequence}`
    this.waiting.set(mapped, then)
    this.session.extension.send(JSON.stringify({ jsonrpc: "2.0", id: mapped, method, params }))
  }

  /** The extension's answer, as its actor passed it on. */
  private onAnswer({ response }: Proxy.Answer) {
    const mapped = response.id
    const then = typeof mapped === "string" ? this.waiting.get(mapped) : undefined
    if (then === undefined || typeof mapped !== "string") return
    this.waiting.delete(mapped)
    then("error" in response ? failed(response.error.message, response.error.code) : { result: response.result ?? {} })
  }

  private event(method: string, params: object, sessionId?: string) {
    this.send({ method, params, ...(sessionId === undefined ? {} : { sessionId }) })
  }

  /** Announces a page as Chrome would: created (when discovering), then attached (when auto-attaching). */
  private announce(page: Page) {
    if (this.discover) this.event("Target.targetCreated", { targetInfo: { ...page.info, attached: true } })
    if (this.autoAttach) this.event("Target.attachedToTarget", { sessionId: page.sessionId, targetInfo: { ...page.info, attached: true }, waitingForDebugger: false })
  }

  /** A page is gone (closed, detached): its client hears it, and nothing more is sent for it. */
  private forgetPage(page: Page) {
    this.pages.delete(page.sessionId)
    this.byTab.delete(page.tabId)
    for (const [child, tabId] of this.children) if (tabId === page.tabId) this.children.delete(child)
    this.event("Target.detachedFromTarget", { sessionId: page.sessionId, targetId: page.info.targetId })
    if (this.discover) this.event("Target.targetDestroyed", { targetId: page.info.targetId })
  }

  private pageOf(targetId: unknown) {
    for (const page of this.pages.values()) if (page.info.targetId === targetId) return page
    return undefined
  }

  /** Opens a tab, and drives it as a page of this client. */
  private createTarget(params: Params, reply: (answer: Answer) => void) {
    const url = typeof params["url"] === "string" && params["url"] !== "" ? params["url"] : "about:blank"
    this.ask("createTab", { url, activate: params["background"] !== true }, (created) => {
      if ("error" in created) return reply(created)
      const tabId = isRecord(created.result) ? created.result["tabId"] : undefined
      if (typeof tabId !== "number") return reply(failed("the extension opened a tab but did not say which"))
      this.ask(Cdp.Method.attach, { tabId, connection_id: this.session.connectionId } satisfies Cdp.AttachParams, (attached) => {
        if ("error" in attached) {
          // A tab the debugger may not attach to (a chrome:// page) is no use to the client that opened it.
          this.ask("closeTab", { tabId }, () => undefined)
          return reply(attached)
        }
        if (!isRecord(attached.result) || typeof attached.result["targetId"] !== "string") return reply(failed("the extension attached the tab but gave no target"))
        // Clients require a context id of every page (Playwright asserts it); the user's browser has one.
        const info = { ...(attached.result as unknown as Cdp.TargetInfo), browserContextId: CONTEXT }
        const page: Page = { tabId, sessionId: `sb-${this.session.connectionId}-${tabId}`, info }
        this.pages.set(page.sessionId, page)
        this.byTab.set(tabId, page)
        // As Chrome does: the client hears of the new target before the answer that names it.
        this.announce(page)
        reply({ result: { targetId: page.info.targetId } })
      })
    })
  }

  /** A command to the browser target: emulated from the client's pages, or refused as Chrome would. */
  private browser(method: string, params: Params, reply: (answer: Answer) => void) {
    const targets = () => [...this.pages.values()].map((p) => ({ ...p.info, attached: true }))
    switch (method) {
      case "Browser.getVersion":
        return reply({ result: { protocolVersion: "1.3", product: "Chrome/Switchboard", revision: "", userAgent: "Switchboard CDP endpoint", jsVersion: "" } })
      case "Browser.setDownloadBehavior":
      case "Target.setRemoteLocations":
        return reply({ result: {} })
      case "Target.getBrowserContexts":
        return reply({ result: { browserContextIds: [] } })
      case "Target.setDiscoverTargets":
        this.discover = params["discover"] === true
        reply({ result: {} })
        if (this.discover) for (const page of this.pages.values()) this.event("Target.targetCreated", { targetInfo: { ...page.info, attached: true } })
        return
      case "Target.setAutoAttach": {
        const was = this.autoAttach
        this.autoAttach = params["autoAttach"] === true
        reply({ result: {} })
        if (this.autoAttach && !was) {
          for (const page of this.pages.values()) this.event("Target.attachedToTarget", { sessionId: page.sessionId, targetInfo: { ...page.info, attached: true }, waitingForDebugger: false })
        }
        return
      }
      case "Target.getTargets":
        return reply({ result: { targetInfos: targets() } })
      case "Target.getTargetInfo": {
        if (params["targetId"] === undefined) return reply({ result: { targetInfo: { targetId: "browser", type: "browser", title: "", url: "", attached: true, canAccessOpener: false } } })
        const page = this.pageOf(params["targetId"])
        return reply(page === undefined ? failed("No target with given id found", InvalidParams) : { result: { targetInfo: { ...page.info, attached: true } } })
      }
      case "Target.createTarget":
        return this.createTarget(params, reply)
      case "Target.attachToTarget": {
        const page = this.pageOf(params["targetId"])
        return reply(page === undefined ? failed("No target with given id found: this client drives only the tabs it opened", InvalidParams) : { result: { sessionId: page.sessionId } })
      }
      case "Target.activateTarget": {
        const page = this.pageOf(params["targetId"])
        if (page === undefined) return reply(failed("No target with given id found", InvalidParams))
        return this.ask("activateTab", { tabId: page.tabId }, (a) => reply("error" in a ? a : { result: {} }))
      }
      case "Target.closeTarget": {
        const page = this.pageOf(params["targetId"])
        if (page === undefined) return reply(failed("No target with given id found", InvalidParams))
        // The tab's removal comes back as `Inspector.detached`, which ends the page.
        return this.ask("closeTab", { tabId: page.tabId }, (a) => reply("error" in a ? a : { result: { success: true } }))
      }
      case "Target.detachFromTarget": {
        const page = typeof params["sessionId"] === "string" ? this.pages.get(params["sessionId"]) : undefined
        if (page === undefined) return reply(failed("No session with given id", InvalidParams))
        this.release(page)
        this.forgetPage(page)
        return reply({ result: {} })
      }
      case "Target.createBrowserContext":
        return reply(failed("Switchboard's CDP endpoint drives the user's own browser, which has one browser context"))
    }
    reply(unsupported(method))
  }

  private release(page: Page) {
    this.ask(Cdp.Method.detach, { tabId: page.tabId, connection_id: this.session.connectionId } satisfies Cdp.DetachParams, () => undefined)
  }

  onFrame(frame: Actors.Frame): void {
    let message: unknown
    try {
      message = JSON.parse(frame.text)
    } catch {
      return this.send({ id: 0, error: { code: -32700, message: "Message must be a valid JSON" } })
    }
    if (!isRecord(message) || typeof message["id"] !== "number" || typeof message["method"] !== "string") {
      return this.send({ id: isRecord(message) && typeof message["id"] === "number" ? message["id"] : 0, error: { code: InvalidRequest, message: "Message must have integer 'id' and string 'method' properties" } })
    }
    const id = message["id"]
    const method = message["method"]
    const params = isRecord(message["params"]) ? message["params"] : {}
    const sessionId = typeof message["sessionId"] === "string" ? message["sessionId"] : undefined
    const reply = (answer: Answer) => this.answer(id, sessionId, answer)
    if (frame.limited) return reply(failed("Rate limit exceeded"))
    if (sessionId === undefined) return this.browser(method, params, reply)
    const page = this.pages.get(sessionId)
    const tabId = page?.tabId ?? this.children.get(sessionId)
    if (tabId === undefined) return reply(failed(`Session with given id not found.`))
    // The page's own session is the tab's root in the extension; a child's keeps Chrome's id.
    const command: Cdp.CommandParams = { tabId, method, params, ...(page === undefined ? { sessionId } : {}) }
    this.ask(Cdp.Method.command, { ...command }, reply)
  }

  /** A CDP event of one of this client's tabs, from the extension. */
  private onEvent({ method, params = {}, sessionId, tabId }: Proxy.CdpEvent) {
    const page = this.byTab.get(tabId)
    if (page === undefined) return
    if (method === Cdp.Detached && sessionId === undefined) return this.forgetPage(page)
    if (method === "Target.attachedToTarget" && typeof params["sessionId"] === "string") this.children.set(params["sessionId"], tabId)
    if (method === "Target.detachedFromTarget" && typeof params["sessionId"] === "string") this.children.delete(params["sessionId"])
    this.event(method, params, sessionId ?? page.sessionId)
  }

  /** A field, not a method: the host hands it on unbound. */
  readonly receive = (message: Proxy.RouterPeer): void => {
    switch (message._tag) {
      case "Answer":
        return this.onAnswer(message)
      case "CdpEvent":
        return this.onEvent(message)
      case "ExtensionGone":
        if (message.connectionId === this.session.connectionId) this.conn.close(Edge.CloseCode.GoingAway, `extension gone: ${message.reason}`)
        return
    }
  }

  /** Lets every tab go, and the extension. */
  closed(replica: Replica) {
    for (const page of this.pages.values()) this.release(page)
    this.waiting.clear()
    return Attachment.detach(replica, this.conn, this.session.connectionId, this.session.extConn)
  }
}

/** Why a CDP socket cannot be served, as its close reason. */
const refuse = (reason: string) => Effect.fail(new Actors.Refuse(Edge.CloseCode.PolicyViolation, reason))

export const make = (replica: Replica) => (conn: Actors.Connection, restored: boolean) =>
  Effect.gen(function*() {
    // The pages and their sessions lived in the replica that stopped: a CDP client cannot carry
    // on without them, and connects again (it gets 1012, "restart").
    if (restored) return yield* Effect.fail(new Actors.Refuse(Edge.CloseCode.ServiceRestart, "the router replica serving this CDP session stopped; connect again"))
    const scope = yield* Effect.scope
    const user = conn.user
    if (user === undefined) return yield* refuse("a bearer token is required")
    const extensionId = decodeURIComponent(conn.open.path.slice(PREFIX.length))
    if (extensionId === "" || extensionId.includes("/")) return yield* refuse(`no CDP endpoint at ${conn.open.path}; use ${PREFIX}{extension_id}`)
    if (!(yield* replica.seat(replica.clientSeats, user, scope))) {
      return yield* refuse(`too many connections for this user (limit ${replica.config.maxClientsPerUser} clients)`)
    }
    const attached = yield* Attachment.attach(replica, conn, user, extensionId)
    if (Option.isNone(attached)) return yield* refuse(`extension ${extensionId} not found or not connected`)
    yield* Attachment.record(replica, conn, user, attached.value)
    const timedOut = (_: string, then: (answer: Answer) => void) => then(failed(replica.timedOut))
    const waiting = yield* Scope.extend(TimedMap.make(replica.timeoutMillis, timedOut, replica.inFlight), scope)
    const client = new CdpClient(conn, attached.value.session, waiting, replica.config.maxPending)
    return {
      onFrame: (frame: Actors.Frame) => client.onFrame(frame),
      receive: client.receive,
      onClosed: () => Effect.zipRight(client.closed(replica), replica.forget(conn))
    } satisfies Actors.Actor<never, Proxy.RouterPeer, Proxy.HandoffState>
  })

