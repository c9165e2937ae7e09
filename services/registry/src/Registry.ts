/**
 * The tool registry: the MCP-B hub (`shared/specs/mcp-b.md`) as a service. Tab bridges connect at
 * `/tabs` and register their page's tools; the tab's actor keeps them in KV (user → domain → tab).
 * MCP clients connect at `/hub` and see all their user's tools as one MCP server. A session's actor
 * follows the user's records through its replica's view (`Views.ts`), lists them under unique
 * names (`Naming.ts`), and routes each call straight to the best tab's socket; the tab's answer
 * comes back through the tab's actor as a peer message.
 */
import { AuthClient } from "@switchboard/auth"
import { Actors, ActorTimer, Bus, ConnectionLimit, Kv, Subjects, TimedMap } from "@switchboard/bus"
import { Edge, Json, JsonRpc, Registry } from "@switchboard/protocol"
import { InternalClient } from "@switchboard/router"
import { Instruments, Metrics, Telemetry } from "@switchboard/telemetry"
import * as CallOutcome from "./CallOutcome.ts"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as FiberSet from "effect/FiberSet"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import type * as Tracer from "effect/Tracer"
import * as RegistryConfig from "./Config.ts"
import * as HubTransport from "./HubTransport.ts"
import * as Naming from "./Naming.ts"
import * as Rejections from "./Rejections.ts"
import * as Views from "./Views.ts"
import { WarningThrottle } from "./WarningThrottle.ts"

const { ErrorCode } = JsonRpc
const CloseCode = Edge.CloseCode
const { Method, PeerKind, TabNotFound } = Registry
const isRecord = JsonRpc.isRecord

const decodeHello = Schema.decodeUnknownEither(Registry.Hello)
const decodeRegister = Schema.decodeUnknownEither(Registry.RegisterTools)

const notification = (method: string, params?: Record<string, unknown>) =>
  JSON.stringify(params === undefined ? { jsonrpc: "2.0", method } : { jsonrpc: "2.0", method, params })
const result = (id: JsonRpc.Id, value: unknown) => JSON.stringify({ jsonrpc: "2.0", id, result: value })
const failure = (id: JsonRpc.Id | null, code: number, message: string) => JsonRpc.encode(JsonRpc.errorResponse(id, code, message))
const LIST_CHANGED = notification("notifications/tools/list_changed")
const sameJson = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b)
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
const hostOf = (url: string): string | undefined => {
  try {
    const u = new URL(url)
    return (u.protocol === "http:" || u.protocol === "https:") && u.host !== "" && u.hostname.length <= MaxHostname ? u.host : undefined
  } catch {
    return undefined
  }
}

const SERVER_INFO = { name: "switchboard-registry", version: "0.1.0" }
const CAPABILITIES = {
  tools: { listChanged: true },
  // MCP-B's capability; under `experimental`, where MCP puts non-standard ones.
  experimental: { browser: { multiTabSupport: true, cacheSupported: true, elicitation: false } }
}

/** A response or progress notification a tab sent, as its actor passes it to the hub's actor. */
interface FromTab {
  readonly tab: string
  readonly message: Record<string, unknown>
}

/**
 * A `from-tab` peer message as it came over the bus. Only tab actors send these, but the bus is
 * not a trust boundary for shape: a message that is not one is logged, never thrown on.
 */
const parseFromTab = (text: string): Either.Either<FromTab, string> => {
  // The tab's frame passed the depth check already; wrapping it here added one level.
  const parsed = Json.parse(text, Json.MAX_DEPTH + 1)
  if (Either.isLeft(parsed)) return Either.left(parsed.left)
  const value = parsed.right
  if (!isRecord(value) || typeof value["tab"] !== "string" || !isRecord(value["message"])) return Either.left("expected {tab: string, message: object}")
  return Either.right({ tab: value["tab"], message: value["message"] })
}

export const make = Effect.gen(function*() {
  const kv = yield* Kv.Kv
  const auth = yield* AuthClient.AuthClient
  const bus = yield* Bus.Bus
  const link = yield* Actors.edgeLink
  const runService = yield* FiberSet.makeRuntime<never>()
  const { tracer } = yield* Telemetry.Tracing
  const traced = Option.isSome(tracer)
  const metrics = yield* Metrics.Metrics
  const inFlight = Instruments.requests(metrics, "registry")
  const toolCall = Instruments.toolCalls(metrics)
  const config = {
    callTimeout: yield* RegistryConfig.callTimeout,
    retries: yield* RegistryConfig.retries,
    retryBackoff: yield* RegistryConfig.retryBackoff,
    tabWait: yield* RegistryConfig.tabWait,
    staleTabAge: yield* RegistryConfig.staleTabAge,
    authTimeout: yield* RegistryConfig.authTimeout,
    pageSize: yield* RegistryConfig.pageSize,
    pageBytes: yield* RegistryConfig.pageBytes,
    maxToolBytes: yield* RegistryConfig.maxToolBytes,
    warningInterval: yield* RegistryConfig.warningInterval,
    maxToolsPerTab: yield* RegistryConfig.maxToolsPerTab,
    maxPending: yield* RegistryConfig.maxPending,
    replicaHeartbeat: yield* RegistryConfig.replicaHeartbeat,
    shutdownGrace: yield* RegistryConfig.shutdownGrace,
    http: {
      replayEvents: yield* RegistryConfig.httpReplayEvents,
      replayAge: yield* RegistryConfig.httpReplayAge,
      idle: yield* RegistryConfig.httpSessionIdle
    },
    maxHttpSessionsPerUser: yield* RegistryConfig.maxHttpSessionsPerUser
  }
  // A Streamable HTTP session outlives its requests until DELETE or its idle timeout, so one user
  // could otherwise open them without end. Counted per replica, as the router counts sockets.
  const httpSessions = new ConnectionLimit(config.maxHttpSessionsPerUser)
  const tabs = Kv.typed(yield* kv.bucket(Subjects.Bucket.tabs), Registry.TabRecord)
  const cachedTools = Kv.typed(yield* kv.bucket(Subjects.Bucket.cachedTools), Registry.CachedToolRecord)
  const connections = yield* kv.bucket(Subjects.Bucket.connections)
  const views = yield* Views.make

  const { forget, recall, remember } = Actors.sessionStore(Kv.typed(yield* kv.bucket(Subjects.Bucket.registrySessions), Registry.SessionRecord))
  /** Closes the socket unless it has said who it is in time. */
  const deadline = (conn: Actors.Connection, reason: string) => ActorTimer.after(config.authTimeout, () => conn.close(CloseCode.PolicyViolation, reason))

  // --- the tab's actor ---------------------------------------------------------------------

  const tabActor = (conn: Actors.Connection, restored: boolean) =>
    Effect.gen(function*() {
      const user = conn.user
      if (user === undefined) return yield* Effect.fail(new Actors.Refuse(CloseCode.PolicyViolation, "Authentication required"))
      const origin = conn.open.origin === undefined ? undefined : hostOf(conn.open.origin)
      let tab: Registry.TabRecord | undefined
      let key = ""
      /** The cached tools this actor last wrote, so re-registering the same list writes nothing. */
      const written = new Map<string, Registry.CachedToolRecord>()
      /** What the tab sends wrong is logged at this rate, however fast it sends it. */
      const warnings = new WarningThrottle(Duration.toMillis(config.warningInterval))
      const warn = (message: string) => {
        const line = warnings.admit(`tab ${tab === undefined ? conn.id : `${tab.tabId} of ${tab.domain} (${conn.id})`}: ${message}`)
        return line === undefined ? Effect.void : Effect.logWarning(line)
      }

      const saved = restored ? yield* recall(conn) : Option.none()
      if (Option.isSome(saved) && saved.value.role === "tab") {
        key = Subjects.Key.tab(user, saved.value.domain, saved.value.tabId)
        const found = yield* tabs.get(key).pipe(Effect.orElseSucceed(() => Option.none()))
        if (Option.isSome(found) && found.value.value.conn === conn.id) tab = found.value.value
      }
      const helloTimer = tab === undefined ? yield* deadline(conn, `${Method.hello} expected first`) : undefined

      /** Whether the record was stored; a failure is logged. */
      const save = (next: Registry.TabRecord) =>
        tabs.put(key, next).pipe(
          Effect.tap(() => Effect.sync(() => (tab = next))),
          Effect.as(true),
          Effect.catchAll((e) => Effect.as(Effect.logWarning(`could not store tab ${next.tabId} of ${next.domain}`, e), false))
        )
      const answer = (id: JsonRpc.Id | undefined, value: unknown) => (id === undefined ? undefined : conn.send(result(id, value)))
      /** A request gets the error; a notification can only be logged. */
      const refuse = (id: JsonRpc.Id | undefined, code: number, message: string) =>
        id === undefined ? warn(message) : Effect.sync(() => conn.send(failure(id, code, message)))

      const hello = (params: unknown, id: JsonRpc.Id | undefined) =>
        Effect.gen(function*() {
          const decoded = decodeHello(params ?? {})
          if (Either.isLeft(decoded)) {
            return conn.close(CloseCode.ProtocolError, `${Method.hello}: expected {tabId, url, title?, active?}`)
          }
          const { active, tabId, url } = decoded.right
          const title = decoded.right.title?.slice(0, MaxTitle)
          const domain = hostOf(url)
          if (domain === undefined) return conn.close(CloseCode.ProtocolError, `${Method.hello}: url must be an http(s) URL with a host name of at most ${MaxHostname} characters`)
          if (origin !== undefined && origin !== domain) {
            return conn.close(CloseCode.PolicyViolation, `the tab's url (${domain}) does not match its Origin (${origin})`)
          }
          if (tab !== undefined) {
            if (tab.tabId !== tabId || tab.domain !== domain) {
              return yield* refuse(id, ErrorCode.InvalidRequest, "Invalid Request: a tab's identity cannot change; open a new socket after navigating")
            }
            yield* save({ ...tab, url, ...(title === undefined ? {} : { title }), activatedAt: active === true ? Date.now() : tab.activatedAt })
            return answer(id, { domain, tabId })
          }
          helloTimer?.cancel()
          key = Subjects.Key.tab(user, domain, tabId)
          // A page reload reconnects with the same tab id: the new socket replaces the old one.
          const previous = yield* tabs.get(key).pipe(Effect.orElseSucceed(() => Option.none()))
          if (Option.isSome(previous) && previous.value.value.conn !== conn.id) {
            const old = previous.value.value
            link.close(Subjects.EdgeId(old.edge), Subjects.ConnId(old.conn), CloseCode.Normal, "replaced by a newer connection of the same tab")
          }
          const now = Date.now()
          yield* save({
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
          yield* remember(conn, { role: "tab", user, domain, tabId })
          yield* Effect.logDebug(`tab ${tabId} of ${domain} (user ${user}) connected`)
          return answer(id, { domain, tabId })
        })

      const register = (current: Registry.TabRecord, method: string, params: unknown, id: JsonRpc.Id | undefined) =>
        Effect.gen(function*() {
          const decoded = decodeRegister(params ?? {})
          if (Either.isLeft(decoded)) return yield* refuse(id, ErrorCode.InvalidParams, `Invalid params: ${method} expects {tools: Tool[]}`)
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
          if (rejected.length > 0) yield* warn(Rejections.logLine(rejected))
          const tabUrl = decoded.right.tabUrl
          const url = tabUrl !== undefined && hostOf(tabUrl) === current.domain ? tabUrl : current.url
          // Idempotent: the same list again changes nothing and tells nobody.
          if (url !== current.url || !sameTools(accepted, current.tools)) {
            const stored = yield* save({ ...current, url, tools: accepted, updatedAt: Date.now() })
            if (!stored) return yield* refuse(id, ErrorCode.InternalError, `Internal error: could not store the tab's tools; send ${method} again`)
          }
          // Only the tools this tab still lists can be written again; the rest would only grow the map.
          for (const name of written.keys()) if (!names.has(name)) written.delete(name)
          for (const tool of accepted) {
            if (!Registry.isCached(tool)) continue
            const record: Registry.CachedToolRecord = { domain: current.domain, url, tool, cachedAt: Date.now() }
            const last = written.get(tool.name)
            if (last !== undefined && last.url === url && sameJson(last.tool, tool)) continue
            written.set(tool.name, record)
            yield* cachedTools.put(Subjects.Key.cachedTool(user, current.domain, tool.name), record).pipe(
              Effect.catchAll((e) => Effect.logWarning(`could not cache tool ${tool.name}`, e))
            )
          }
          return answer(id, { registered: accepted.length, ...Rejections.forTab(rejected) })
        })

      /** A response or progress notification for a hub session: its id or token starts with the session's conn id. */
      const toHub = (frame: Actors.Frame, message: Record<string, unknown>, routing: unknown) => {
        if (typeof routing !== "string") return
        const hub = routing.slice(0, routing.indexOf(":"))
        if (!Subjects.isConnId(hub)) return
        const value: FromTab = { tab: conn.id, message }
        // The frame is valid JSON already; it travels inside the envelope without being encoded again.
        conn.peer(hub, PeerKind.fromTab, `{"tab":${JSON.stringify(conn.id)},"message":${frame.text}}`, frame.traceparent, value)
      }

      const onFrame = (frame: Actors.Frame): Effect.Effect<void> | void => {
        const decoded = JsonRpc.decodeFrame(frame.text)
        if (Either.isLeft(decoded)) return conn.send(JsonRpc.encode(decoded.left))
        const incoming = decoded.right
        const message = incoming.message as Record<string, unknown>
        if (incoming._tag === "Response") return toHub(frame, message, message["id"])
        const { method, params } = incoming.message as JsonRpc.Notification
        const id = incoming._tag === "Request" ? incoming.message.id : undefined
        if (method === "notifications/progress") return toHub(frame, message, isRecord(params) ? params["progressToken"] : undefined)
        if (method === "notifications/cancelled") return toHub(frame, message, isRecord(params) ? params["requestId"] : undefined)
        if (frame.limited) return refuse(id, ErrorCode.ServerError, "Rate limit exceeded")
        if (method === Method.hello) return hello(params, id)
        const current = tab
        if (current === undefined) return refuse(id, ErrorCode.InvalidRequest, `Invalid Request: send ${Method.hello} first`)
        switch (method) {
          case Method.registerTools:
          case Method.updateTools:
            return register(current, method, params, id)
          case Method.activated:
            return Effect.zipRight(save({ ...current, activatedAt: Date.now() }), Effect.sync(() => answer(id, {})))
        }
        if (id !== undefined) return conn.send(failure(id, ErrorCode.MethodNotFound, `Method not found: ${method}`))
      }

      const onClosed = () =>
        Effect.gen(function*() {
          yield* forget(conn)
          if (tab === undefined) return
          const current = yield* tabs.get(key)
          // A newer socket of the same tab may own the entry already.
          if (Option.isSome(current) && current.value.value.conn === conn.id) yield* tabs.delete(key)
        }).pipe(Effect.catchAll((e) => Effect.logWarning(`could not remove closed tab ${conn.id}; it is pruned once stale`, e)))

      return { onFrame, onClosed } satisfies Actors.Actor
    })

  // --- the MCP session's actor (`/hub`) ----------------------------------------------------

  /** The tab an attempt went to: what routes its answer, and what a hand-off carries. */
  type TabRef = Pick<Registry.TabRecord, "conn" | "edge" | "domain" | "tabId">

  interface Call {
    readonly id: JsonRpc.Id
    readonly key: string
    /** The tool's name as the client called it, and the tab's tool it stands for. */
    readonly name: string
    readonly target: Naming.Target
    readonly args: Record<string, unknown>
    readonly progressToken: string | number | undefined
    readonly span: Tracer.Span | undefined
    /** Where its answer, and its progress before that, go. */
    readonly exchange: HubTransport.Exchange
    /** Tabs it was sent to so far. */
    attempts: number
    /** Whether a tab was opened for it already (a cached tool with no tab). */
    opened: boolean
    phase: "sent" | "opening" | "backoff"
    /** The id of the attempt in flight, and the tab it went to. */
    mapped: string | undefined
    tab: TabRef | undefined
    /** While it waits for a tab to open, or to be retried; an attempt in flight times out in `byMapped`. */
    timer: ReturnType<typeof setTimeout> | undefined
  }

  const callTimeoutMillis = Duration.toMillis(config.callTimeout)
  const tabWaitMillis = Duration.toMillis(config.tabWait)
  const backoffMillis = Duration.toMillis(config.retryBackoff)
  const idKey = (id: JsonRpc.Id) => `${typeof id}:${id}`

  const decodeHubHandoff = Schema.decodeUnknownOption(Registry.HubHandoff)

  const hubActor = (conn: Actors.Connection, restored: boolean, handedOver: unknown) =>
    Effect.gen(function*() {
      const scope = yield* Effect.scope
      /** Requests this actor started (a tab to open), which end with it; a set only once there is one. */
      let started: Set<Fiber.RuntimeFiber<void>> | undefined
      yield* Scope.addFinalizer(scope, Effect.suspend(() => (started === undefined ? Effect.void : Fiber.interruptAll(started))))
      // The service's runtime rather than a FiberSet per actor: one costs a Runtime and fiber refs
      // for every idle session (issue 16), while few sessions ever open a tab.
      const runFork = (effect: Effect.Effect<void>) => {
        const fiber = runService(effect)
        ;(started ??= new Set()).add(fiber)
        fiber.addObserver(() => started?.delete(fiber))
      }
      let user = conn.user
      const http = conn.open.transport === "http"
      // A Streamable HTTP session is opened by the edge with the request's verified token, and never authenticates in-band.
      if (http && user === undefined) return yield* Effect.fail(new Actors.Refuse(CloseCode.PolicyViolation, "Authentication required"))
      if (http && user !== undefined) {
        // An adopted session was admitted by the replica that had it.
        const release = httpSessions.take(user, restored)
        if (release === undefined) {
          return yield* Effect.fail(
            new Actors.Refuse(CloseCode.PolicyViolation, `too many Streamable HTTP sessions for this user (at most ${config.maxHttpSessionsPerUser}); DELETE one or let it expire`)
          )
        }
        yield* Effect.addFinalizer(() => Effect.sync(release))
      }
      const transport = http ? yield* HubTransport.http(conn, link, config.http) : HubTransport.webSocket(conn)
      let view: Views.View | undefined
      /** Set once `initialize` was answered. */
      let protocolVersion: string | undefined
      /** The list the client last saw (or was told changed), to push `list_changed` only on change. */
      let shown: Naming.Aggregate | undefined
      let wakeQueued = false
      const calls = new Map<string, Call>()
      /** Attempts in flight by mapped id; an attempt's tab gets `notifications/cancelled` once it times out. */
      // In the actor's scope: once the session is handed over or its replica stops, a call that
      // expires here would answer a client the new owner answers, or no one.
      const byMapped = yield* TimedMap.make<string, Call>(callTimeoutMillis, (mapped, call) => {
        const tab = call.tab
        if (tab === undefined) return
        socketOf(tab).send(notification("notifications/cancelled", { requestId: mapped, reason: "timed out" }))
        fail(call, ErrorCode.InternalError, `Tool call timed out after ${Duration.format(config.callTimeout)} in tab ${tab.tabId} of ${tab.domain}`, "timeout")
      }, inFlight)
      let seq = 0
      const stopTimers = () => {
        for (const call of calls.values()) {
          if (call.timer !== undefined) clearTimeout(call.timer)
          call.timer = undefined
        }
      }
      // A call's own timers (waiting for a tab, a retry's pause) end with the actor too, for any
      // reason. An actor that ends interrupted was neither closed nor handed over: its replica
      // stopped with no other to take the session. Its calls get an error now rather than silence.
      // Scope.addFinalizerExit, not Effect.addFinalizer: that one keeps a copy of this fiber's refs.
      yield* Scope.addFinalizerExit(scope, (exit) =>
        Effect.sync(() => {
          stopTimers()
          if (Exit.isSuccess(exit)) return
          for (const call of [...calls.values()]) fail(call, ErrorCode.ServerError, "The registry replica serving this session stopped; call the tool again")
        })
      )

      const traceOf = (span: Tracer.AnySpan | undefined) => (span === undefined ? undefined : Telemetry.traceHeaders(span).traceparent)

      const attach = (owner: string) =>
        Effect.gen(function*() {
          user = owner
          const v = yield* Scope.extend(views.acquire(owner), scope)
          view = v
          // Changes arrive outside the mailbox; they come back in as a message, in order with frames.
          const unlisten = v.listen(() => {
            if (wakeQueued) return
            wakeQueued = true
            conn.peer(conn.id, PeerKind.wake, "")
          })
          yield* Scope.addFinalizer(scope, Effect.sync(unlisten))
        })

      const saved = restored ? yield* recall(conn) : Option.none()
      if (Option.isSome(saved) && saved.value.role === "hub") {
        protocolVersion = saved.value.protocolVersion
        yield* attach(saved.value.user)
        shown = view?.aggregate()
      } else if (user !== undefined) {
        yield* attach(user)
        yield* remember(conn, { role: "hub", user })
      }
      const authTimer = view === undefined ? yield* deadline(conn, "Authentication failed: no authenticate message in time") : undefined
      const close = transport.close

      // --- calls: route to the best tab, retry when it closes, open one for a cached tool ---

      const done = (call: Call) => {
        if (call.timer !== undefined) clearTimeout(call.timer)
        calls.delete(call.key)
        if (call.mapped !== undefined) byMapped.delete(call.mapped)
      }
      const fail = (call: Call, code: number, message: string, outcome = CallOutcome.ofFailure(code)) => {
        done(call)
        toolCall(outcome)
        call.exchange.reply(failure(call.id, code, message), traceOf(call.span))
      }

      /** MCP-B routing (spec section 3): the tab in the name, the domain's active tab, the latest updated. */
      const pick = (target: Naming.Target): Registry.TabRecord | undefined => {
        const domainTabs = view?.tabs().get(target.domain)
        if (domainTabs === undefined) return undefined
        const has = (t: Registry.TabRecord) => t.tools.some((tool) => tool.name === target.tool)
        const named = target.tabId === undefined ? undefined : domainTabs.get(target.tabId)
        if (named !== undefined && has(named)) return named
        const all = [...domainTabs.values()]
        const active = Naming.activeTab(all, target.domain)
        if (active !== undefined && has(active)) return active
        let best: Registry.TabRecord | undefined
        for (const t of all) if (has(t) && (best === undefined || t.updatedAt > best.updatedAt)) best = t
        return best
      }

      const sockets = new Map<string, Actors.Socket>()
      const socketOf = (tab: TabRef) => {
        let s = sockets.get(tab.conn)
        if (s === undefined) {
          if (sockets.size > 1_000) sockets.clear()
          sockets.set(tab.conn, (s = link.to(Subjects.EdgeId(tab.edge), Subjects.ConnId(tab.conn))))
        }
        return s
      }

      const dispatch = (call: Call) => {
        const { domain, tool } = call.target
        const tab = pick(call.target)
        if (tab !== undefined) return sendTo(call, tab)
        const cached = view?.cached(domain, tool)
        if (cached !== undefined && !call.opened && user !== undefined) return openTab(call, cached, user)
        if (call.phase === "opening") return // still waiting for the tab it opened
        fail(call, TabNotFound, `TabNotFound: no open tab of ${domain} has the tool ${tool}`)
      }

      const sendTo = (call: Call, tab: Registry.TabRecord) => {
        if (call.timer !== undefined) clearTimeout(call.timer)
        call.timer = undefined
        if (call.mapped !== undefined) byMapped.delete(call.mapped)
        const mapped = `${conn.id}:${++seq}`
        call.attempts++
        call.phase = "sent"
        call.mapped = mapped
        call.tab = tab
        byMapped.set(mapped, call)
        call.span?.attribute("mcp.mapped_id", mapped)
        const params = {
          toolName: call.target.tool,
          args: call.args,
          ...(call.progressToken === undefined ? {} : { _meta: { progressToken: mapped } })
        }
        const traceparent = call.span === undefined ? undefined : Telemetry.traceHeaders(call.span).traceparent
        socketOf(tab).send(JSON.stringify({ jsonrpc: "2.0", id: mapped, method: Method.executeTool, params }), traceparent)
      }

      const openTab = (call: Call, cached: Registry.CachedToolRecord, owner: string) => {
        call.opened = true
        call.phase = "opening"
        const { domain, tool } = call.target
        const url = cached.url
        awaitTab(call, url)
        runFork(
          InternalClient.request(owner, "createTab", { url }).pipe(
            Effect.provideService(Bus.Bus, bus),
            Effect.catchAll((e) =>
              Effect.sync(() => {
                if (calls.get(call.key) === call && call.phase === "opening") {
                  fail(call, TabNotFound, `TabNotFound: no open tab of ${domain} has ${tool}, and opening ${url} failed: ${e.message}`)
                }
              })
            )
          )
        )
      }

      /** A call waits this long for the tab it opened at `url` to register its tool. */
      const awaitTab = (call: Call, url: string) => {
        const { domain, tool } = call.target
        if (call.timer !== undefined) clearTimeout(call.timer)
        call.timer = setTimeout(
          () => fail(call, TabNotFound, `TabNotFound: opened ${url}, but no tab of ${domain} registered ${tool} within ${Duration.format(config.tabWait)}`),
          tabWaitMillis
        )
      }

      /** A retry waits before it dispatches again. */
      const backOff = (call: Call) => {
        call.phase = "backoff"
        if (call.timer !== undefined) clearTimeout(call.timer)
        call.timer = setTimeout(() => {
          call.timer = undefined
          dispatch(call)
        }, backoffMillis)
      }

      /** The tab a call went to closed (its entry is gone or belongs to a newer socket). */
      const tabClosed = (call: Call, tab: TabRef) => {
        if (call.mapped !== undefined) byMapped.delete(call.mapped)
        call.mapped = undefined
        if (call.attempts > config.retries) {
          return fail(call, ErrorCode.InternalError, `Tab ${tab.tabId} of ${tab.domain} closed during the call; gave up after ${call.attempts} attempts`)
        }
        backOff(call)
      }

      const toolsCall = (request: JsonRpc.Request, ex: HubTransport.Exchange, span: Tracer.Span | undefined) => {
        const params = isRecord(request.params) ? request.params : {}
        const name = params["name"]
        const args = params["arguments"] ?? {}
        const meta = params["_meta"]
        const progressToken = isRecord(meta) ? meta["progressToken"] : undefined
        if (typeof name !== "string" || !isRecord(args) || (progressToken !== undefined && typeof progressToken !== "string" && typeof progressToken !== "number")) {
          return ex.reply(failure(request.id, ErrorCode.InvalidParams, "Invalid params: tools/call expects {name: string, arguments?: object}"))
        }
        const key = idKey(request.id)
        if (calls.has(key)) return ex.reply(failure(request.id, ErrorCode.InvalidRequest, `Invalid Request: id ${String(request.id)} is already in flight`))
        if (calls.size >= config.maxPending) return ex.reply(failure(request.id, ErrorCode.ServerError, `Too many calls in flight (limit ${config.maxPending})`))
        const listed = view?.aggregate().byName.get(name)
        if (listed === undefined) return ex.reply(failure(request.id, TabNotFound, `TabNotFound: no tool named ${name}; tools/list shows what the open tabs offer`))
        span?.attribute("mcp.tool.domain", listed.target.domain)
        const call: Call = {
          id: request.id,
          key,
          name: listed.name,
          target: listed.target,
          args,
          progressToken,
          span,
          exchange: ex,
          attempts: 0,
          opened: false,
          phase: "sent",
          mapped: undefined,
          tab: undefined,
          timer: undefined
        }
        calls.set(key, call)
        dispatch(call)
      }

      const toolsList = (request: JsonRpc.Request, ex: HubTransport.Exchange) => {
        const all = view?.aggregate() ?? { tools: [] }
        const params = isRecord(request.params) ? request.params : {}
        const cursor = params["cursor"]
        let offset = 0
        if (cursor !== undefined) {
          offset = typeof cursor === "string" && /^[0-9]+$/.test(cursor) ? Number(cursor) : -1
          if (offset < 0 || offset > all.tools.length) return ex.reply(failure(request.id, ErrorCode.InvalidParams, "Invalid params: unknown cursor"))
        }
        // A page ends at pageSize tools or before pageBytes, whichever comes first, but holds at
        // least one tool: a page of large tools could otherwise outgrow what the bus and the edge
        // carry, and the session would be closed on every attempt to list.
        const parts: Array<string> = []
        let bytes = 0
        let end = offset
        while (end < all.tools.length && parts.length < config.pageSize) {
          const part = JSON.stringify(Naming.toMcp(all.tools[end]!))
          const size = Buffer.byteLength(part) + 1
          if (parts.length > 0 && bytes + size > config.pageBytes) break
          parts.push(part)
          bytes += size
          end++
        }
        shown = view?.aggregate()
        // The tools are serialized once, to measure them, and joined as they are.
        const next = end < all.tools.length ? `,"nextCursor":${JSON.stringify(String(end))}` : ""
        ex.reply(`{"jsonrpc":"2.0","id":${JSON.stringify(request.id)},"result":{"tools":[${parts.join(",")}]${next}}}`)
      }

      const initialize = (request: JsonRpc.Request, ex: HubTransport.Exchange) => {
        const params = isRecord(request.params) ? request.params : {}
        const asked = params["protocolVersion"]
        const version = Registry.ProtocolVersions.find((v) => v === asked) ?? Registry.ProtocolVersions[0]
        protocolVersion = version
        shown = view?.aggregate()
        ex.reply(result(request.id, { protocolVersion: version, capabilities: CAPABILITIES, serverInfo: SERVER_INFO }))
        return user === undefined ? undefined : remember(conn, { role: "hub", user, protocolVersion: version })
      }

      const authenticate = (message: JsonRpc.Request | JsonRpc.Notification, id: JsonRpc.Id | undefined, ex: HubTransport.Exchange) =>
        Effect.gen(function*() {
          const params = isRecord(message.params) ? message.params : {}
          const token = params["token"] ?? params["accessToken"] ?? params["access_token"]
          if (typeof token !== "string") return close(CloseCode.PolicyViolation, "Authentication failed: authenticate needs params.token")
          const claims = yield* Effect.either(auth.verify(token))
          if (Either.isLeft(claims)) return close(CloseCode.PolicyViolation, `Authentication failed: ${claims.left.reason}`)
          if (user !== undefined && claims.right.sub !== user) {
            return close(CloseCode.PolicyViolation, "Authentication failed: a session cannot change its user")
          }
          if (view === undefined) {
            authTimer?.cancel()
            yield* attach(claims.right.sub)
            yield* remember(conn, { role: "hub", user: claims.right.sub })
          }
          if (id !== undefined) ex.reply(result(id, {}))
        })

      const onRequest = (request: JsonRpc.Request, frame: Actors.Frame, ex: HubTransport.Exchange): Effect.Effect<void> | void => {
        if (frame.limited) return ex.reply(failure(request.id, ErrorCode.ServerError, "Rate limit exceeded"))
        switch (request.method) {
          case "initialize":
            return initialize(request, ex)
          case "ping":
            return ex.reply(result(request.id, {}))
          case "authenticate":
            return authenticate(request, request.id, ex)
        }
        if (protocolVersion === undefined) {
          return ex.reply(failure(request.id, ErrorCode.InvalidRequest, "Invalid Request: the session is not initialized; send initialize first"))
        }
        if (request.method === "tools/list") return toolsList(request, ex)
        if (request.method !== "tools/call") return ex.reply(failure(request.id, ErrorCode.MethodNotFound, `Method not found: ${request.method}`))
        if (!traced) return toolsCall(request, ex, undefined)
        // Not String(): an object with a "toString" field that is not a function makes it throw.
        const named = isRecord(request.params) ? request.params["name"] : undefined
        const name = typeof named === "string" ? named : ""
        return Effect.currentSpan.pipe(
          Effect.map((span) => toolsCall(request, ex, span)),
          // Tool names are many (per domain and tab): they go in attributes, not span names.
          Effect.withSpan("registry.call", {
            kind: "server",
            attributes: { "rpc.method": "tools/call", "mcp.tool.name": name, "mcp.request.id": String(request.id), "sb.conn": conn.id, "user_id": user ?? "" }
          }),
          Telemetry.withRemoteParent(frame.traceparent),
          Effect.ignore
        )
      }

      const cancelled = (params: unknown) => {
        if (!isRecord(params)) return
        const requestId = params["requestId"]
        if (typeof requestId !== "string" && typeof requestId !== "number") return
        const call = calls.get(idKey(requestId))
        if (call === undefined) return
        done(call)
        // A cancelled request gets no answer; its HTTP exchange ends without one.
        call.exchange.end()
        if (call.phase === "sent" && call.mapped !== undefined && call.tab !== undefined) {
          const reason = typeof params["reason"] === "string" ? params["reason"] : "cancelled by the client"
          socketOf(call.tab).send(notification("notifications/cancelled", { requestId: call.mapped, reason }))
        }
      }

      const onFrame = (frame: Actors.Frame): Effect.Effect<void> | void => {
        if (transport.control(frame)) return
        const ex = transport.exchange(frame)
        if (!transport.admits(frame, user)) {
          // The edge checks a session's owner before it forwards; this is the actor's own check.
          return ex.reply(failure(null, ErrorCode.InvalidRequest, "Invalid Request: this session belongs to another user"))
        }
        const decoded = JsonRpc.decodeFrame(frame.text)
        // The WebSocket transport: an invalid frame is a protocol error, and closes the session.
        // Over HTTP, the request that carried it is answered, and the session carries on.
        if (Either.isLeft(decoded)) {
          ex.reply(JsonRpc.encode(decoded.left))
          return transport.kind === "ws" ? close(CloseCode.ProtocolError, decoded.left.error.message) : undefined
        }
        const incoming = decoded.right
        if (incoming._tag === "Response") return // the hub asks clients nothing
        const message = incoming.message
        const id = incoming._tag === "Request" ? incoming.message.id : undefined
        if (view === undefined) {
          if (message.method === "authenticate") return authenticate(message, id, ex)
          return close(CloseCode.PolicyViolation, "Authentication required: send authenticate first, or connect with ?token=")
        }
        if (incoming._tag === "Request") return onRequest(incoming.message, frame, ex)
        if (message.method === "notifications/cancelled") return cancelled(message.params)
        // notifications/initialized and anything else a client announces need no answer.
      }

      const onWake = () => {
        wakeQueued = false
        const now = view?.aggregate()
        if (protocolVersion !== undefined && shown !== undefined && now !== undefined && !sameList(shown, now)) {
          shown = now
          transport.push(LIST_CHANGED)
        }
        for (const call of [...calls.values()]) {
          if (call.phase === "opening") dispatch(call)
          else if (call.phase === "sent" && call.tab !== undefined) {
            const tab = call.tab
            if (view?.tabs().get(tab.domain)?.get(tab.tabId)?.conn !== tab.conn) tabClosed(call, tab)
          }
        }
      }

      const fromTab = (message: Bus.BusMessage): Effect.Effect<void> | void => {
        let from = Actors.localValue(message) as FromTab | undefined
        if (from === undefined) {
          const parsed = parseFromTab(Bus.text(message))
          if (Either.isLeft(parsed)) return Effect.logWarning(`hub ${conn.id}: dropped a malformed ${PeerKind.fromTab} message: ${parsed.left}`)
          from = parsed.right
        }
        const m = from.message
        const params = isRecord(m["params"]) ? m["params"] : {}
        if (m["method"] === "notifications/progress") {
          const token = params["progressToken"]
          const call = typeof token === "string" ? byMapped.get(token) : undefined
          if (call === undefined || call.tab?.conn !== from.tab || call.progressToken === undefined) return
          return call.exchange.notify(notification("notifications/progress", { ...params, progressToken: call.progressToken }))
        }
        const cancelled = m["method"] === "notifications/cancelled"
        const mapped = cancelled ? params["requestId"] : m["id"]
        const call = typeof mapped === "string" ? byMapped.get(mapped) : undefined
        // Late (timed out, cancelled), or not from the tab the call went to: dropped.
        if (call === undefined || call.tab?.conn !== from.tab) return
        done(call)
        toolCall(cancelled ? "cancelled" : CallOutcome.ofTabAnswer(m))
        const reason = typeof params["reason"] === "string" ? `: ${params["reason"]}` : ""
        const answer = cancelled ? failure(call.id, ErrorCode.InternalError, `The tab cancelled the call${reason}`) : answerOf(call, m)
        if (call.span === undefined) return call.exchange.reply(answer)
        return Effect.currentSpan.pipe(
          Effect.map((span) => call.exchange.reply(answer, traceOf(span))),
          Effect.withSpan("registry.reply", {
            kind: "server",
            parent: call.span,
            attributes: { "rpc.method": "tools/call", "mcp.tool.name": call.name, "mcp.request.id": String(call.id), "mcp.mapped_id": mapped, "sb.conn": conn.id, "user_id": user ?? "" }
          }),
          Effect.ignore
        )
      }

      const onPeer = (message: Bus.BusMessage): Effect.Effect<void> | void => {
        const kind = message.header(Subjects.Header.kind)
        if (kind === PeerKind.fromTab) return fromTab(message)
        if (kind === PeerKind.wake) return onWake()
      }

      const onClosed = () =>
        Effect.suspend(() => {
          for (const call of calls.values()) if (call.timer !== undefined) clearTimeout(call.timer)
          calls.clear()
          byMapped.clear()
          transport.ended()
          return forget(conn)
        })

      /**
       * The session moves to another replica: its calls in flight go with it, and from here on
       * this actor answers none of them (its mailbox is handled up to here, and its timers stop),
       * so each gets one answer, from the new owner. Their attempts' timeouts start again there.
       */
      const onHandoff = (): Registry.HubHandoff => {
        const handed: Array<Registry.HubHandoff["calls"][number]> = []
        for (const call of calls.values()) {
          const ref = call.exchange.ref
          // An answer with nowhere to go (an HTTP request that named no exchange) goes nowhere there either.
          if (ref === undefined) continue
          handed.push({
            id: call.id,
            name: call.name,
            target: call.target,
            args: call.args,
            ...(call.progressToken === undefined ? {} : { progressToken: call.progressToken }),
            exchange: ref,
            attempts: call.attempts,
            opened: call.opened,
            phase: call.phase,
            ...(call.mapped === undefined ? {} : { mapped: call.mapped }),
            ...(call.tab === undefined ? {} : { tab: { conn: call.tab.conn, edge: call.tab.edge, domain: call.tab.domain, tabId: call.tab.tabId } })
          })
        }
        stopTimers()
        byMapped.clear()
        return { role: "hub", seq, calls: handed }
      }

      // Calls in flight at the replica that handed this session over: their tabs answer here.
      const handed = decodeHubHandoff(handedOver)
      if (Option.isSome(handed)) {
        seq = Math.max(seq, handed.value.seq)
        for (const c of handed.value.calls) {
          const key = idKey(c.id)
          if (calls.has(key)) continue
          const call: Call = {
            id: c.id,
            key,
            name: c.name,
            target: c.target,
            args: c.args,
            progressToken: c.progressToken,
            span: undefined,
            exchange: transport.resume(c.exchange),
            attempts: c.attempts,
            opened: c.opened,
            phase: c.phase,
            mapped: c.mapped,
            tab: c.tab,
            timer: undefined
          }
          calls.set(key, call)
          if (call.phase === "backoff") backOff(call)
          else if (call.phase === "opening") awaitTab(call, view?.cached(call.target.domain, call.target.tool)?.url ?? call.target.domain)
          else if (call.mapped !== undefined) byMapped.set(call.mapped, call)
          else dispatch(call)
        }
        // A tab that closed while the session moved: its calls are retried, as on any wake.
        if (calls.size > 0) {
          wakeQueued = true
          conn.peer(conn.id, PeerKind.wake, "")
        }
      }

      return { onFrame, onPeer, onClosed, onHandoff } satisfies Actors.Actor
    })

  /** The client's answer to a call, from the tab's answer to `browser/executeTool`. */
  const answerOf = (call: Call, m: Record<string, unknown>): string => {
    if ("error" in m && isRecord(m["error"])) {
      const error = m["error"]
      // The tab's own fields, checked rather than converted: String() throws on {"toString": 1}.
      const given = error["code"]
      const code = typeof given === "number" && Number.isSafeInteger(given) ? given : ErrorCode.InternalError
      return failure(call.id, code, typeof error["message"] === "string" ? error["message"] : "the tab failed")
    }
    const answered = m["result"]
    if (!Registry.isExecuteResult(answered)) return failure(call.id, ErrorCode.InternalError, "Internal error: the tab answered browser/executeTool without {success, payload}")
    const { payload, success } = answered
    const text = typeof payload === "string" ? payload : JSON.stringify(payload)
    if (!success) return result(call.id, { content: [{ type: "text", text }], isError: true })
    return result(call.id, isRecord(payload) && Array.isArray(payload["content"]) ? payload : { content: [{ type: "text", text }] })
  }

  const sameList = (a: Naming.Aggregate, b: Naming.Aggregate) =>
    a === b || (a.tools.length === b.tools.length && sameJson(a.tools.map(Naming.toMcp), b.tools.map(Naming.toMcp)))

  yield* Actors.host({
    service: "registry",
    replicaHeartbeat: config.replicaHeartbeat,
    shutdownGrace: config.shutdownGrace,
    make: (conn, restored, handedOver) => (conn.open.path === "/tabs" ? tabActor(conn, restored) : hubActor(conn, restored, handedOver))
  })

  // Tab entries outlive their socket only when every replica that could clean them up died with
  // it; they go once old enough and no connection owns them.
  const staleMillis = Duration.toMillis(config.staleTabAge)
  yield* Effect.gen(function*() {
    for (const { key, value } of yield* tabs.values()) {
      if (Date.now() - value.updatedAt < staleMillis) continue
      if (Option.isSome(yield* connections.get(value.conn))) continue
      yield* tabs.delete(key)
      yield* Effect.logInfo(`pruned the stale entry of tab ${value.tabId} of ${value.domain}`)
    }
  }).pipe(
    Effect.catchAll((e) => Effect.logWarning("pruning stale tabs failed", e)),
    Effect.repeat(Schedule.spaced(Duration.min(config.staleTabAge, Duration.minutes(1)))),
    Effect.forkScoped
  )
})

export const layer = Layer.scopedDiscard(make)
