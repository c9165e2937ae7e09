/**
 * The actor of a CDP client's socket (`/cdp/{extension_id}`): Playwright's `connectOverCDP`,
 * Puppeteer's `connect` and the MCP servers built on them drive the user's own browser through
 * the extension, as one more client of the router. The client speaks the Chrome DevTools Protocol
 * with flattened sessions; the extension can only give page-level CDP (`chrome.debugger`), so the
 * browser target is emulated here: `Target.*` maps onto the extension's tabs, each tab this client
 * opened is a page session of its own, and the tab's CDP events come back through the extension's
 * `forwardCDPEvent` (`@switchboard/protocol/browser/Cdp`). A client drives only the tabs it
 * opened; the extension refuses a tab another client drives. All of it is data (what each command
 * in flight awaits too), so that a replica that stops hands the session to another whole.
 */
import { Actors, TimedMap } from "@switchboard/bus"
import { Edge, Proxy } from "@switchboard/protocol"
import * as Cdp from "@switchboard/protocol/browser/Cdp"
import { isRecord, shapeIssue } from "@switchboard/protocol/JsonRpc"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
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
/** Whom an answer goes to: the client's own id, in its own session. */
interface ReplyTo {
  readonly id: number
  readonly sessionId?: string
}
type AwaitedOf<Tag extends Proxy.CdpAwaited["_tag"]> = Extract<Proxy.CdpAwaited, { readonly _tag: Tag }>
const UNANSWERED: Proxy.CdpAwaited = { _tag: "Unanswered" }

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
const decodeTarget = Schema.decodeUnknownEither(Proxy.CdpTargetInfo)

class CdpClient implements Actors.Actor<never, Proxy.RouterPeer, Proxy.HandoffState> {
  private readonly pages = new Map<string, Page>()
  private readonly byTab = new Map<number, Page>()
  /** Child targets (iframes, workers) Chrome attached in a tab, by their session id. */
  private readonly children = new Map<string, number>()
  private autoAttach = false
  private discover = false
  private sequence = 0

  constructor(
    private readonly replica: Replica,
    private readonly conn: Actors.Connection,
    private readonly session: Attachment.Session,
    /** The edge of the extension's socket, for the replica this session is handed to. */
    private readonly extensionEdge: string,
    /** The extension's answers awaited, by mapped id. */
    private readonly waiting: TimedMap<string, Proxy.CdpAwaited>
  ) {}

  private send(message: object) {
    this.conn.send(JSON.stringify(message))
  }

  private reply({ id, sessionId }: ReplyTo, answer: Answer) {
    this.send({ id, ...(sessionId === undefined ? {} : { sessionId }), ...answer })
  }

  /** One method of the extension; its result or error goes where `awaited` says (`settle`). */
  private ask(method: string, params: Params, awaited: Proxy.CdpAwaited) {
    const { maxPending } = this.replica.config
    if (this.waiting.size >= maxPending) return this.settle(awaited, failed(`Too many pending commands (limit ${maxPending})`))
    const mapped = `${this.session.connectionId}:cdp-${++this.sequence}`
    this.waiting.set(mapped, awaited)
    this.session.extension.send(JSON.stringify({ jsonrpc: "2.0", id: mapped, method, params }))
  }

  /** The extension's answer (or a timeout) to what `awaited` was asked for. */
  settle(awaited: Proxy.CdpAwaited, answer: Answer): void {
    switch (awaited._tag) {
      case "Command":
        return this.reply(awaited, answer)
      case "CreateTab":
        return this.tabCreated(awaited, answer)
      case "AttachTab":
        return this.tabAttached(awaited, answer)
      case "ActivateTab":
        return this.reply(awaited, "error" in answer ? answer : { result: {} })
      case "CloseTab":
        return this.reply(awaited, "error" in answer ? answer : { result: { success: true } })
      case "Unanswered":
        return
    }
  }

  /** The extension's answer, as its actor passed it on. */
  private onAnswer({ response }: Proxy.Answer) {
    const mapped = response.id
    const awaited = typeof mapped === "string" ? this.waiting.get(mapped) : undefined
    if (awaited === undefined || typeof mapped !== "string") return
    this.waiting.delete(mapped)
    this.settle(awaited, "error" in response ? failed(response.error.message, response.error.code) : { result: response.result ?? {} })
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

  /** Opens a tab (`tabCreated` then attaches it), and drives it as a page of this client. */
  private createTarget(params: Params, to: ReplyTo) {
    const url = typeof params["url"] === "string" && params["url"] !== "" ? params["url"] : "about:blank"
    this.ask("createTab", { url, activate: params["background"] !== true }, { ...to, _tag: "CreateTab" })
  }

  private tabCreated(to: AwaitedOf<"CreateTab">, created: Answer) {
    if ("error" in created) return this.reply(to, created)
    const tabId = isRecord(created.result) ? created.result["tabId"] : undefined
    if (typeof tabId !== "number") return this.reply(to, failed("the extension opened a tab but did not say which"))
    this.ask(Cdp.Method.attach, { tabId, connection_id: this.session.connectionId } satisfies Cdp.AttachParams, { ...to, _tag: "AttachTab", tabId })
  }

  private tabAttached(to: AwaitedOf<"AttachTab">, attached: Answer) {
    const tabId = to.tabId
    if ("error" in attached) {
      // A tab the debugger may not attach to (a chrome:// page) is no use to the client that opened it.
      this.ask("closeTab", { tabId }, UNANSWERED)
      return this.reply(to, attached)
    }
    const target = decodeTarget(attached.result)
    if (Either.isLeft(target)) return this.reply(to, failed(`the extension attached the tab but gave no target (${shapeIssue(target.left)})`))
    // Clients require a context id of every page (Playwright asserts it); the user's browser has one.
    const info = { ...target.right, browserContextId: CONTEXT }
    const page: Page = { tabId, sessionId: `sb-${this.session.connectionId}-${tabId}`, info }
    this.pages.set(page.sessionId, page)
    this.byTab.set(tabId, page)
    // As Chrome does: the client hears of the new target before the answer that names it.
    this.announce(page)
    this.reply(to, { result: { targetId: page.info.targetId } })
  }

  /** A command to the browser target: emulated from the client's pages, or refused as Chrome would. */
  private browser(method: string, params: Params, to: ReplyTo) {
    const reply = (answer: Answer) => this.reply(to, answer)
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
        return this.createTarget(params, to)
      case "Target.attachToTarget": {
        const page = this.pageOf(params["targetId"])
        return reply(page === undefined ? failed("No target with given id found: this client drives only the tabs it opened", InvalidParams) : { result: { sessionId: page.sessionId } })
      }
      case "Target.activateTarget": {
        const page = this.pageOf(params["targetId"])
        if (page === undefined) return reply(failed("No target with given id found", InvalidParams))
        return this.ask("activateTab", { tabId: page.tabId }, { ...to, _tag: "ActivateTab" })
      }
      case "Target.closeTarget": {
        const page = this.pageOf(params["targetId"])
        if (page === undefined) return reply(failed("No target with given id found", InvalidParams))
        // The tab's removal comes back as `Inspector.detached`, which ends the page.
        return this.ask("closeTab", { tabId: page.tabId }, { ...to, _tag: "CloseTab" })
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
    this.ask(Cdp.Method.detach, { tabId: page.tabId, connection_id: this.session.connectionId } satisfies Cdp.DetachParams, UNANSWERED)
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
    const to: ReplyTo = sessionId === undefined ? { id } : { id, sessionId }
    if (frame.limited) return this.reply(to, failed("Rate limit exceeded"))
    if (sessionId === undefined) return this.browser(method, params, to)
    const page = this.pages.get(sessionId)
    const tabId = page?.tabId ?? this.children.get(sessionId)
    if (tabId === undefined) return this.reply(to, failed(`Session with given id not found.`))
    // The page's own session is the tab's root in the extension; a child's keeps Chrome's id.
    const command: Cdp.CommandParams = { tabId, method, params, ...(page === undefined ? { sessionId } : {}) }
    this.ask(Cdp.Method.command, { ...command }, { ...to, _tag: "Command" })
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
  onClosed() {
    return Effect.suspend(() => {
      for (const page of this.pages.values()) this.release(page)
      this.waiting.clear()
      return Effect.zipRight(Attachment.detach(this.replica, this.conn, this.session.connectionId, this.session.extConn), this.replica.forget(this.conn))
    })
  }

  /**
   * Its replica stops: everything the session is, for the replica that adopts the socket. The
   * proxy connection stays the same, so the extension goes on driving the same tabs for it, and
   * sends their events and the answers in flight to the same socket, now served there.
   */
  onHandoff(): Proxy.HandoffState {
    const { connectionId, extConn, extensionId } = this.session
    return {
      role: "cdp",
      connectionId,
      extensionId,
      extensionConn: extConn,
      extensionEdge: this.extensionEdge,
      pages: [...this.pages.values()].map(({ info, sessionId, tabId }) => ({ tabId, sessionId, info })),
      children: [...this.children].map(([sessionId, tabId]) => ({ sessionId, tabId })),
      autoAttach: this.autoAttach,
      discover: this.discover,
      sequence: this.sequence,
      pending: [...this.waiting.entries()].map(([mapped, awaited]) => ({ mapped, awaited }))
    }
  }

  /** Carries on the session a stopping replica handed over (`onHandoff`); its client notices nothing. */
  adopt(state: HandedOver) {
    for (const { info, sessionId, tabId } of state.pages) {
      const page: Page = { tabId, sessionId, info }
      this.pages.set(sessionId, page)
      this.byTab.set(tabId, page)
    }
    for (const { sessionId, tabId } of state.children) this.children.set(sessionId, tabId)
    this.autoAttach = state.autoAttach
    this.discover = state.discover
    this.sequence = state.sequence
    // Their time starts again here: a command is not failed for the time its hand-off took.
    for (const { awaited, mapped } of state.pending) this.waiting.set(mapped, awaited)
  }
}

type HandedOver = Extract<Proxy.HandoffState, { readonly role: "cdp" }>

/** Why a CDP socket cannot be served, as its close reason. */
const refuse = (reason: string) => Effect.fail(new Actors.Refuse(Edge.CloseCode.PolicyViolation, reason))

/** The actor of one session, with its commands in flight, which end with its scope. */
const serve = (replica: Replica, conn: Actors.Connection, session: Attachment.Session, extensionEdge: string) =>
  Effect.gen(function*() {
    const expired = (_: string, awaited: Proxy.CdpAwaited) => client.settle(awaited, failed(replica.timedOut))
    const waiting = yield* Scope.extend(TimedMap.make(replica.timeoutMillis, expired, replica.inFlight), yield* Effect.scope)
    const client = new CdpClient(replica, conn, session, extensionEdge, waiting)
    return client
  })

export const make = (replica: Replica) => (conn: Actors.Connection, restored: boolean, handedOver: Proxy.HandoffState | undefined) =>
  Effect.gen(function*() {
    const scope = yield* Effect.scope
    const user = conn.user
    if (restored) {
      // Adopted after its replica died (no hand-off): the pages, their sessions and the commands
      // in flight were only in that replica's memory; the client connects again (1012, "restart").
      if (handedOver?.role !== "cdp" || user === undefined) {
        return yield* Effect.fail(new Actors.Refuse(Edge.CloseCode.ServiceRestart, "the router replica serving this CDP session stopped; connect again"))
      }
      // Admitted by the replica that handed it over.
      yield* replica.seat(replica.clientSeats, user, scope, true)
      const client = yield* serve(replica, conn, Attachment.sessionOf(replica, handedOver), handedOver.extensionEdge)
      client.adopt(handedOver)
      return client
    }
    if (user === undefined) return yield* refuse("a bearer token is required")
    const extensionId = decodeURIComponent(conn.open.path.slice(PREFIX.length))
    if (extensionId === "" || extensionId.includes("/")) return yield* refuse(`no CDP endpoint at ${conn.open.path}; use ${PREFIX}{extension_id}`)
    if (!(yield* replica.seat(replica.clientSeats, user, scope))) {
      return yield* refuse(`too many connections for this user (limit ${replica.config.maxClientsPerUser} clients)`)
    }
    const attached = yield* Attachment.attach(replica, conn, user, extensionId)
    if (Option.isNone(attached)) return yield* refuse(`extension ${extensionId} not found or not connected`)
    yield* Attachment.record(replica, conn, user, attached.value)
    return yield* serve(replica, conn, attached.value.session, attached.value.edge)
  })
