/**
 * The actor of a tab bridge's socket (`/tabs`): the bridge authenticates (a token at the upgrade,
 * or an `authenticate` message first, `Authenticate.ts`), the tab says who it is (`browser/hello`), registers
 * its page's tools, and keeps them in KV (user → domain → tab) while its socket is open. The tab's
 * answers to calls go on to the `/hub` session that asked, told as `Registry.FromTab` (`ToolCall.ts`).
 */
import { type Actors, type ActorTimer, Subjects } from "@switchboard/bus"
import { Edge, JsonRpc, Registry } from "@switchboard/protocol"
import { sameJson } from "@switchboard/protocol/Json"
import { failure, result } from "@switchboard/protocol/JsonRpc"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import * as Authenticate from "./Authenticate.ts"
import * as Rejections from "./Rejections.ts"
import * as Replica from "./Replica.ts"
import { WarningThrottle } from "./WarningThrottle.ts"

const { ErrorCode } = JsonRpc
const CloseCode = Edge.CloseCode
const { Method } = Registry
const isRecord = JsonRpc.isRecord

const decodeHello = Schema.decodeUnknownEither(Registry.Hello)
const decodeRegister = Schema.decodeUnknownEither(Registry.RegisterTools)

/** The same tools, in whatever order the page lists them. */
const sameTools = (a: ReadonlyArray<Registry.Tool>, b: ReadonlyArray<Registry.Tool>) => {
  if (a.length !== b.length) return false
  const byName = new Map(b.map((t) => [t.name, t]))
  return a.every((t) => sameJson(t, byName.get(t.name)))
}

/** DNS caps a name at 253 characters; the domain goes into every one of its tools' descriptions. */
const MaxHostname = 253
/** A page title goes into every one of the tab's tools' descriptions; longer ones are cut. */
const MaxTitle = 256

/** The host (with port) of an http(s) URL, or undefined. */
export const hostOf = (url: string): string | undefined => {
  try {
    const u = new URL(url)
    return (u.protocol === "http:" || u.protocol === "https:") && u.host !== "" && u.hostname.length <= MaxHostname ? u.host : undefined
  } catch {
    return undefined
  }
}

/**
 * One tab's actor, once built. A class, so that every tab shares its handlers: as closures over
 * the actor's variables they were nine functions and a large context per idle tab (issue 16).
 */
class Tab implements Actors.Actor, Authenticate.Authenticating {
  private tab: Registry.TabRecord | undefined
  private key = ""
  /**
   * The revision of the tab's record that this actor last wrote or read. Its writes are
   * compare-and-set against it, so that a socket of the same tab cannot write over another's
   * record. Without this, a hello held up by a NATS failover wrote its record after a reload's
   * socket had written, and the live socket's tools were gone from every /hub (chaos suite).
   */
  private revision: number | undefined
  /** The cached tools this actor last wrote, so re-registering the same list writes nothing; made with the first. */
  private written: Map<string, Registry.CachedToolRecord> | undefined
  /** What the tab sends wrong is logged at this rate, however fast it sends it; made with the first warning. */
  private warnings: WarningThrottle | undefined
  /** Closes the socket unless it authenticated and said hello in time; cancelled by its hello. */
  helloTimer: ActorTimer.ActorTimer | undefined

  constructor(
    private readonly replica: Replica.Replica,
    readonly conn: Actors.Connection,
    /** From the upgrade's token or the record of an adopted tab; none until `authenticate` otherwise. */
    private currentUser: string | undefined,
    /** The host of the socket's Origin, which the tab's url must match. */
    private readonly origin: string | undefined
  ) {}

  user() {
    return this.currentUser
  }
  /** Its first `authenticate`: the tab is this user's. Its deadline runs on, for hello. */
  authenticated(user: string) {
    return Effect.sync(() => {
      this.currentUser = user
    })
  }
  close(code: number, reason: string) {
    this.conn.close(code, reason)
  }

  /** The tab this actor had, when it is adopted and its KV record still names its connection. */
  restore(key: string, record: Registry.TabRecord, revision: number) {
    this.key = key
    this.tab = record
    this.revision = revision
  }
  get registered() {
    return this.tab !== undefined
  }

  private warn(message: string) {
    const tab = this.tab
    const warnings = (this.warnings ??= new WarningThrottle(Duration.toMillis(this.replica.config.warningInterval)))
    const line = warnings.admit(`tab ${tab === undefined ? this.conn.id : `${tab.tabId} of ${tab.domain} (${this.conn.id})`}: ${message}`)
    return line === undefined ? Effect.void : Effect.logWarning(line)
  }

  /**
   * Whether the record was stored; a failure is logged. It is written over the revision this actor
   * knows, and only over its own record after that: when another socket of the tab wrote first
   * (both said hello at once, or a reload's socket replaced this one), that socket keeps the
   * record and this one closes, as a replaced socket does.
   */
  private save(next: Registry.TabRecord) {
    const { tabs } = this.replica
    const write = (revision: number | undefined) => (revision === undefined ? tabs.create(this.key, next) : tabs.update(this.key, next, revision))
    return write(this.revision).pipe(
      // The record says what conflicted: this actor's own write, applied though its answer was lost
      // (a NATS leader died), a record deleted meanwhile, or another socket's.
      Effect.catchTag("KvConflict", (conflict) =>
        Effect.flatMap(tabs.get(this.key), (found) =>
          Option.isNone(found)
            ? write(undefined)
            : found.value.value.conn === this.conn.id
            ? write(found.value.revision)
            : Effect.fail(conflict))
      ),
      Effect.tap((revision) =>
        Effect.sync(() => {
          const before = this.tab
          this.tab = next
          this.revision = revision
          if (before === undefined || before.tools !== next.tools || before.url !== next.url) this.replica.toolsChanged(next.user)
        })
      ),
      Effect.as(true),
      Effect.catchTag("KvConflict", () =>
        Effect.as(Effect.sync(() => this.close(CloseCode.Normal, "replaced by a newer connection of the same tab")), false)),
      Effect.catchAll((e) => Effect.as(Effect.logWarning(`could not store tab ${next.tabId} of ${next.domain}`, e), false))
    )
  }
  private answer(id: JsonRpc.Id | undefined, value: unknown) {
    return id === undefined ? undefined : this.conn.send(result(id, value))
  }
  /** A request gets the error; a notification can only be logged. */
  private refuse(id: JsonRpc.Id | undefined, code: number, message: string) {
    return id === undefined ? this.warn(message) : Effect.sync(() => this.conn.send(failure(id, code, message)))
  }

  private hello(user: string, params: unknown, id: JsonRpc.Id | undefined) {
    return Effect.gen(this, function*() {
      const { conn } = this
      const decoded = decodeHello(params ?? {})
      if (Either.isLeft(decoded)) {
        return conn.close(CloseCode.ProtocolError, `${Method.hello}: expected {tabId, url, title?, active?}`)
      }
      const { active, tabId, url } = decoded.right
      const title = decoded.right.title?.slice(0, MaxTitle)
      const domain = hostOf(url)
      if (domain === undefined) return conn.close(CloseCode.ProtocolError, `${Method.hello}: url must be an http(s) URL with a host name of at most ${MaxHostname} characters`)
      if (this.origin !== undefined && this.origin !== domain) {
        return conn.close(CloseCode.PolicyViolation, `the tab's url (${domain}) does not match its Origin (${this.origin})`)
      }
      const tab = this.tab
      if (tab !== undefined) {
        if (tab.tabId !== tabId || tab.domain !== domain) {
          return yield* this.refuse(id, ErrorCode.InvalidRequest, "Invalid Request: a tab's identity cannot change; open a new socket after navigating")
        }
        yield* this.save({ ...tab, url, ...(title === undefined ? {} : { title }), activatedAt: active === true ? Date.now() : tab.activatedAt })
        return this.answer(id, { domain, tabId })
      }
      this.helloTimer?.cancel()
      this.key = Subjects.Key.tab(user, domain, tabId)
      const { link, remember, tabs } = this.replica
      // A page reload reconnects with the same tab id: the new socket replaces the old one.
      const previous = yield* tabs.get(this.key).pipe(Effect.orElseSucceed(() => Option.none()))
      if (Option.isSome(previous) && previous.value.value.conn !== conn.id) {
        const old = previous.value.value
        link.close(Subjects.EdgeId(old.edge), Subjects.ConnId(old.conn), CloseCode.Normal, "replaced by a newer connection of the same tab")
      }
      // What this socket writes over: the record just read, or none.
      this.revision = Option.getOrUndefined(Option.map(previous, (p) => p.revision))
      const now = Date.now()
      const stored = yield* this.save({
        user,
        domain,
        tabId,
        url,
        ...(title === undefined ? {} : { title }),
        conn: conn.id,
        edge: conn.edge,
        activatedAt: active === true ? now : 0,
        updatedAt: now,
        tools: []
      })
      if (!stored) return yield* this.refuse(id, ErrorCode.InternalError, `Internal error: could not store the tab; send ${Method.hello} again`)
      yield* remember(conn, { role: "tab", user, domain, tabId })
      yield* Effect.logDebug(`tab ${tabId} of ${domain} (user ${user}) connected`)
      return this.answer(id, { domain, tabId })
    })
  }

  private register(current: Registry.TabRecord, method: string, params: unknown, id: JsonRpc.Id | undefined) {
    return Effect.gen(this, function*() {
      const { cachedTools, config } = this.replica
      const decoded = decodeRegister(params ?? {})
      if (Either.isLeft(decoded)) return yield* this.refuse(id, ErrorCode.InvalidParams, `Invalid params: ${method} expects {tools: Tool[]}`)
      const accepted: Array<Registry.Tool> = []
      const rejected: Array<Registry.ToolRejection> = []
      const names = new Set<string>()
      for (const candidate of decoded.right.tools) {
        const tool = Registry.validateTool(candidate, config.maxToolBytes)
        if (Either.isLeft(tool)) rejected.push(tool.left)
        else if (names.has(tool.right.name)) rejected.push(Registry.rejectTool("duplicate", tool.right.name, "listed twice; the first one counts"))
        else if (accepted.length >= config.maxToolsPerTab) {
          rejected.push(Registry.rejectTool("over-limit", tool.right.name, `over the limit of ${config.maxToolsPerTab} tools per tab`))
        } else {
          names.add(tool.right.name)
          accepted.push(tool.right)
        }
      }
      // One bounded line, at a bounded rate: the tab's answer has the details.
      if (rejected.length > 0) yield* this.warn(Rejections.logLine(rejected))
      const tabUrl = decoded.right.tabUrl
      const url = tabUrl !== undefined && hostOf(tabUrl) === current.domain ? tabUrl : current.url
      // Idempotent: the same list again changes nothing and tells nobody.
      if (url !== current.url || !sameTools(accepted, current.tools)) {
        const stored = yield* this.save({ ...current, url, tools: accepted, updatedAt: Date.now() })
        if (!stored) return yield* this.refuse(id, ErrorCode.InternalError, `Internal error: could not store the tab's tools; send ${method} again`)
      }
      // Only the tools this tab still lists can be written again; the rest would only grow the map.
      const written = this.written
      if (written !== undefined) for (const name of written.keys()) if (!names.has(name)) written.delete(name)
      for (const tool of accepted) {
        if (!Registry.isCached(tool)) continue
        const record: Registry.CachedToolRecord = { domain: current.domain, url, tool, cachedAt: Date.now() }
        const last = written?.get(tool.name)
        if (last !== undefined && last.url === url && sameJson(last.tool, tool)) continue
        ;(this.written ??= new Map()).set(tool.name, record)
        yield* cachedTools.put(Subjects.Key.cachedTool(current.user, current.domain, tool.name), record).pipe(
          Effect.catchAll((e) => Effect.logWarning(`could not cache tool ${tool.name}`, e))
        )
      }
      return this.answer(id, { registered: accepted.length, ...Rejections.forTab(rejected) })
    })
  }

  /** A response or progress notification for a hub session: its id or token starts with the session's conn id. */
  private toHub(frame: Actors.Frame, message: Registry.FromTab["message"], routing: unknown) {
    if (typeof routing !== "string") return
    const hub = routing.slice(0, routing.indexOf(":"))
    if (!Subjects.isConnId(hub)) return
    // Parsed once, here: a hub actor on this replica takes the value as it is.
    Replica.peers.tell(this.conn, hub, { _tag: "FromTab", tab: this.conn.id, message }, frame.traceparent)
  }

  onFrame(frame: Actors.Frame): Effect.Effect<void> | void {
    const decoded = JsonRpc.decodeFrame(frame.text)
    if (Either.isLeft(decoded)) return this.conn.send(JsonRpc.encode(decoded.left))
    const incoming = decoded.right
    const user = this.currentUser
    const send = this.conn.send
    // Before its user is known, a socket's frames are not acted on: not even an answer is routed.
    if (user === undefined) return Authenticate.beforeUser(this.replica.auth, this, incoming, send)
    if (incoming._tag === "Response") return this.toHub(frame, incoming.message, incoming.message.id)
    const { method, params } = incoming.message
    const id = incoming._tag === "Request" ? incoming.message.id : undefined
    if (method === "notifications/progress") return this.toHub(frame, incoming.message, isRecord(params) ? params["progressToken"] : undefined)
    if (method === "notifications/cancelled") return this.toHub(frame, incoming.message, isRecord(params) ? params["requestId"] : undefined)
    if (frame.limited) return this.refuse(id, ErrorCode.ServerError, "Rate limit exceeded")
    if (method === Registry.Authenticate) return Authenticate.authenticate(this.replica.auth, this, params, id, send)
    if (method === Method.hello) return this.hello(user, params, id)
    const current = this.tab
    if (current === undefined) return this.refuse(id, ErrorCode.InvalidRequest, `Invalid Request: send ${Method.hello} first`)
    switch (method) {
      case Method.registerTools:
      case Method.updateTools:
        return this.register(current, method, params, id)
      case Method.activated:
        return Effect.zipRight(this.save({ ...current, activatedAt: Date.now() }), Effect.sync(() => this.answer(id, {})))
    }
    if (id !== undefined) return this.conn.send(failure(id, ErrorCode.MethodNotFound, `Method not found: ${method}`))
  }

  onClosed() {
    return Effect.gen(this, function*() {
      const { forget, tabs } = this.replica
      yield* forget(this.conn)
      if (this.tab === undefined) return
      // A newer socket of the same tab may own the entry already, or write it while this one lets go.
      if (yield* tabs.deleteOwned(this.key, (record) => record.conn === this.conn.id)) this.replica.toolsChanged(this.tab.user)
    }).pipe(Effect.catchAll((e) => Effect.logWarning(`could not remove closed tab ${this.conn.id}; it is pruned once stale`, e)))
  }
}

export const make = (replica: Replica.Replica) => (conn: Actors.Connection, restored: boolean) =>
  Effect.gen(function*() {
    const { deadline, recall, tabs } = replica
    const saved = restored ? yield* recall(conn) : Option.none()
    const remembered = Option.isSome(saved) && saved.value.role === "tab" ? saved.value : undefined
    // An adopted tab that authenticated in-band has no user at the upgrade: its record names it.
    const user = conn.user ?? remembered?.user
    const tab = new Tab(replica, conn, user, conn.open.origin === undefined ? undefined : hostOf(conn.open.origin))
    if (remembered !== undefined && remembered.user === user) {
      const key = Subjects.Key.tab(user, remembered.domain, remembered.tabId)
      const found = yield* tabs.get(key).pipe(Effect.orElseSucceed(() => Option.none()))
      if (Option.isSome(found) && found.value.value.conn === conn.id) tab.restore(key, found.value.value, found.value.revision)
    }
    // One deadline for both steps: a socket without a token must authenticate and say hello within it.
    if (!tab.registered) tab.helloTimer = yield* deadline(conn, () => (tab.user() === undefined ? Authenticate.NotInTime : `${Method.hello} expected first`))
    return tab
  })
