/**
 * The actor of an MCP session at `/hub`, over either transport (`HubTransport.ts`): it
 * authenticates the client, follows its user's records through the replica's view (`Views.ts`),
 * lists them under unique names (`Naming.ts`) and pushes `list_changed` when they change. Its
 * `tools/call`s are `ToolCall.ts`'s; a tab's answer comes back through the tab's actor, told as
 * `Registry.FromTab`.
 */
import { ActorResource, Actors, type ActorTimer } from "@switchboard/bus"
import { Edge, JsonRpc, Registry } from "@switchboard/protocol"
import { sameJson } from "@switchboard/protocol/Json"
import { failure, notification, result } from "@switchboard/protocol/JsonRpc"
import { Telemetry } from "@switchboard/telemetry"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import type * as Tracer from "effect/Tracer"
import * as Authenticate from "./Authenticate.ts"
import * as HubTransport from "./HubTransport.ts"
import * as Naming from "./Naming.ts"
import * as Replica from "./Replica.ts"
import * as ToolCall from "./ToolCall.ts"
import * as ToolsPage from "./ToolsPage.ts"
import type * as Views from "./Views.ts"

const { ErrorCode } = JsonRpc
const CloseCode = Edge.CloseCode
/** The same message every time: a wake carries nothing. */
const WAKE = new Registry.Wake()
/** Written once: every session's view change sends it. */
const LIST_CHANGED = notification("notifications/tools/list_changed")
const isRecord = JsonRpc.isRecord

// `title` is for display (MCP 2025-06-18 on); older clients ignore a field they do not know.
const SERVER_INFO = { name: "switchboard-registry", title: "Switchboard tool hub", version: "0.1.0" }
const CAPABILITIES = {
  tools: { listChanged: true },
  // MCP-B's capability; under `experimental`, where MCP puts non-standard ones.
  experimental: { browser: { multiTabSupport: true, cacheSupported: true, elicitation: false } }
}

const decodeCancelled = Schema.decodeUnknownEither(Registry.CancelledParams)
const decodeInitialize = Schema.decodeUnknownEither(Registry.InitializeParams)

const sameList = (a: Naming.Aggregate, b: Naming.Aggregate) =>
  a === b || (a.tools.length === b.tools.length && sameJson(a.tools.map(Naming.toMcp), b.tools.map(Naming.toMcp)))

/**
 * One session, once its actor is built. A class, so that every session shares its handlers: as
 * closures over the actor's variables they were about 20 functions and a large context per idle
 * session (issue 16). It is also what its calls see of it (`ToolCall.Session`) and what its user's
 * view tells of a change (`Views.Listener`).
 */
class Session implements Actors.Actor<never, Registry.RegistryPeer, Registry.HubHandoff>, ToolCall.Session, Views.Listener, Authenticate.Authenticating {
  private currentUser: string | undefined
  private currentView: Views.View | undefined
  /** Set once `initialize` was answered. */
  private protocolVersion: string | undefined
  /** The list the client last saw (or was told changed), to push `list_changed` only on change. */
  private shown: Naming.Aggregate | undefined
  private wakeQueued = false
  /**
   * The session's tool calls, made with its first `tools/call` (or with the calls a hand-off
   * brought): most sessions sit idle, and their maps, timer and closures were a few KB of each
   * idle /hub socket (issue 16).
   */
  private calls: ToolCall.ToolCalls | undefined
  /** Requests this actor started (a tab to open), which end with it; a set only once there is one. */
  private started: Set<Fiber.RuntimeFiber<unknown, unknown>> | undefined
  /** Closes the session unless it authenticates in time; only for one that connected without a token. */
  authTimer: ActorTimer.ActorTimer | undefined
  /** Whether `release` is among the scope's finalizers yet. */
  private releasing = false

  constructor(
    private readonly replica: Replica.Replica,
    readonly conn: Actors.Connection,
    private readonly transport: HubTransport.HubTransport,
    private readonly scope: Scope.Scope,
    user: string | undefined
  ) {
    this.currentUser = user
  }

  // --- what its calls and its view see of it ------------------------------------------------

  view() {
    return this.currentView
  }
  user() {
    return this.currentUser
  }
  /**
   * The service's runtime rather than a FiberSet per actor: one costs a Runtime and fiber refs
   * for every idle session (issue 16), while few sessions ever open a tab.
   */
  runFork<A, E>(effect: Effect.Effect<A, E>) {
    const fiber = this.replica.runService(effect)
    const started = (this.started ??= new Set())
    started.add(fiber)
    fiber.addObserver(() => started.delete(fiber))
  }
  /** Changes arrive outside the mailbox; they come back in as a message, in order with frames. */
  changed() {
    if (this.wakeQueued) return
    this.wakeQueued = true
    Replica.peers.tell(this.conn, this.conn.id, WAKE)
  }

  // --- its state ----------------------------------------------------------------------------

  /** Follows `owner`'s view from here on, until the actor's scope closes. */
  attach(owner: string, version?: string) {
    return Effect.map(Scope.extend(this.replica.views.acquire(owner), this.scope), (view) => {
      this.currentUser = owner
      this.currentView = view
      if (version !== undefined) {
        this.protocolVersion = version
        this.shown = view.aggregate()
      }
      view.listen(this)
    }).pipe(Effect.zipLeft(this.releaseWithScope()))
  }

  /** One finalizer for what the session itself holds, added once it holds something. */
  private releaseWithScope(): Effect.Effect<void> {
    if (this.releasing) return Effect.void
    this.releasing = true
    return Scope.addFinalizerExit(this.scope, releaseOf(this))
  }

  /** What the session holds beyond its scope's own resources: its place among the view's listeners, and the fibers it started. */
  release(): Effect.Effect<void> {
    this.currentView?.unlisten(this)
    const started = this.started
    return started === undefined ? Effect.void : Fiber.interruptAll(started)
  }

  /** The session's calls, made on first need. */
  ensureCalls(): Effect.Effect<ToolCall.ToolCalls> {
    return Effect.zipRight(this.releaseWithScope(), Effect.map(Scope.extend(ToolCall.make(this.replica, this), this.scope), (made) => (this.calls = made)))
  }

  /** A handed-over session's calls go on here; true when some were taken on. */
  resume(handedOver: Registry.HubHandoff): Effect.Effect<boolean> {
    return Effect.map(this.ensureCalls(), (calls) => calls.resume(handedOver, this.transport) > 0)
  }

  close(code: number, reason: string) {
    this.transport.close(code, reason)
  }

  /** The user its first `authenticate` verified: it follows that user's view from now on. */
  authenticated(user: string) {
    this.authTimer?.cancel()
    return Effect.zipRight(this.attach(user), this.replica.remember(this.conn, { role: "hub", user }))
  }

  // --- requests -------------------------------------------------------------------------------

  private toolsCall(request: JsonRpc.Request, ex: HubTransport.Exchange, span: Tracer.Span | undefined) {
    const params = Registry.decodeToolsCallParams(request.params)
    if (Either.isLeft(params)) return ex.reply(failure(request.id, ErrorCode.InvalidParams, "Invalid params: tools/call expects {name: string, arguments?: object}"))
    this.calls?.start(request, params.right, ex, span)
  }

  private toolsList(request: JsonRpc.Request, ex: HubTransport.Exchange) {
    const fields = ToolsPage.page(this.currentView?.aggregate() ?? { tools: [], byName: new Map() }, isRecord(request.params) ? request.params : {}, this.replica.config)
    if (fields === undefined) return ex.reply(failure(request.id, ErrorCode.InvalidParams, "Invalid params: unknown cursor"))
    this.shown = this.currentView?.aggregate()
    ex.reply(ToolsPage.answer(request.id, fields))
  }

  private initialize(request: JsonRpc.Request, ex: HubTransport.Exchange) {
    const params = decodeInitialize(request.params ?? {})
    if (Either.isLeft(params)) {
      return ex.reply(failure(request.id, ErrorCode.InvalidParams, `Invalid params: initialize expects {protocolVersion: string} (${JsonRpc.shapeIssue(params.left)})`))
    }
    const asked = params.right.protocolVersion
    const version = Registry.ProtocolVersions.find((v) => v === asked) ?? Registry.ProtocolVersions[0]
    this.protocolVersion = version
    this.shown = this.currentView?.aggregate()
    ex.reply(result(request.id, { protocolVersion: version, capabilities: CAPABILITIES, serverInfo: SERVER_INFO }))
    const user = this.currentUser
    return user === undefined ? undefined : this.replica.remember(this.conn, { role: "hub", user, protocolVersion: version })
  }

  private onRequest(request: JsonRpc.Request, frame: Actors.Frame, ex: HubTransport.Exchange): Effect.Effect<void> | void {
    if (frame.limited) return ex.reply(failure(request.id, ErrorCode.ServerError, "Rate limit exceeded"))
    switch (request.method) {
      case "initialize":
        return this.initialize(request, ex)
      case "ping":
        return ex.reply(result(request.id, {}))
      case Registry.Authenticate:
        return Authenticate.authenticate(this.replica.auth, this, request.params, request.id, ex.reply)
    }
    if (this.protocolVersion === undefined) {
      return ex.reply(failure(request.id, ErrorCode.InvalidRequest, "Invalid Request: the session is not initialized; send initialize first"))
    }
    if (request.method === "tools/list") return this.toolsList(request, ex)
    if (request.method !== "tools/call") return ex.reply(failure(request.id, ErrorCode.MethodNotFound, `Method not found: ${request.method}`))
    if (this.calls === undefined) return Effect.flatMap(this.ensureCalls(), () => this.onRequest(request, frame, ex) ?? Effect.void)
    if (!this.replica.traced) return this.toolsCall(request, ex, undefined)
    // Not String(): an object with a "toString" field that is not a function makes it throw.
    const named = isRecord(request.params) ? request.params["name"] : undefined
    const name = typeof named === "string" ? named : ""
    return Effect.currentSpan.pipe(
      Effect.map((span) => this.toolsCall(request, ex, span)),
      // Tool names are many (per domain and tab): they go in attributes, not span names.
      Effect.withSpan("registry.call", {
        kind: "server",
        attributes: {
          "rpc.method": "tools/call",
          "mcp.tool.name": name,
          "mcp.request.id": String(request.id),
          "sb.conn": this.conn.id,
          "user_id": this.currentUser ?? ""
        }
      }),
      Telemetry.withRemoteParent(frame.traceparent),
      Effect.ignore
    )
  }

  // --- the actor ------------------------------------------------------------------------------

  onFrame(frame: Actors.Frame): Effect.Effect<void> | void {
    const transport = this.transport
    if (transport.control(frame)) return
    const ex = transport.exchange(frame)
    if (!transport.admits(frame, this.currentUser)) {
      // The edge checks a session's owner before it forwards; this is the actor's own check.
      return ex.reply(failure(null, ErrorCode.InvalidRequest, "Invalid Request: this session belongs to another user"))
    }
    const decoded = JsonRpc.decodeFrame(frame.text)
    // The WebSocket transport: an invalid frame is a protocol error, and closes the session.
    // Over HTTP, the request that carried it is answered, and the session carries on.
    if (Either.isLeft(decoded)) {
      ex.reply(JsonRpc.encode(decoded.left))
      return transport.kind === "ws" ? this.close(CloseCode.ProtocolError, decoded.left.error.message) : undefined
    }
    const incoming = decoded.right
    if (this.currentView === undefined) return Authenticate.beforeUser(this.replica.auth, this, incoming, ex.reply)
    if (incoming._tag === "Response") return // the hub asks clients nothing
    const message = incoming.message
    if (incoming._tag === "Request") return this.onRequest(incoming.message, frame, ex)
    if (message.method === "notifications/cancelled") {
      // A malformed cancel names no call this session could find: it is ignored, as MCP asks.
      const params = decodeCancelled(message.params)
      if (Either.isRight(params)) this.calls?.cancel(ToolCall.keyOf(params.right.requestId), params.right.reason)
      return
    }
    // notifications/initialized and anything else a client announces need no answer.
  }

  private onWake() {
    this.wakeQueued = false
    const now = this.currentView?.aggregate()
    const shown = this.shown
    if (this.protocolVersion !== undefined && shown !== undefined && now !== undefined && !sameList(shown, now)) {
      this.shown = now
      this.transport.push(LIST_CHANGED)
    }
    this.calls?.tabsChanged()
  }

  /** A field, not a method: the host hands it on unbound. */
  readonly receive = (message: Registry.RegistryPeer): Effect.Effect<void> | void =>
    // A tab's answer to a session that never called a tool answers nothing here.
    message._tag === "FromTab" ? this.calls?.fromTab(message) : this.onWake()

  onClosed() {
    return Effect.suspend(() => {
      this.calls?.closed()
      this.transport.ended()
      return this.replica.forget(this.conn)
    })
  }

  onHandoff(): Registry.HubHandoff {
    const stream = this.transport.handOff()
    return { role: "hub", ...(this.calls?.handOff() ?? { seq: 0, calls: [] }), ...(stream === undefined ? {} : { stream }) }
  }
}

/** Out here, so that the finalizer holds the session alone. */
const releaseOf = (session: Session) => () => session.release()

export const make = (replica: Replica.Replica) => (conn: Actors.Connection, restored: boolean, handedOver: Registry.HubHandoff | undefined) =>
  Effect.gen(function*() {
    const { config, deadline, httpSessions, link, recall, remember } = replica
    const scope = yield* Effect.scope
    const user = conn.user
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
      yield* ActorResource.onClose(scope, release)
    }
    const transport = http ? yield* HubTransport.http(conn, link, config.http, handedOver?.stream) : HubTransport.webSocket(conn)
    const session = new Session(replica, conn, transport, scope, user)

    const saved = restored ? yield* recall(conn) : Option.none()
    if (Option.isSome(saved) && saved.value.role === "hub") {
      yield* session.attach(saved.value.user, saved.value.protocolVersion)
    } else if (user !== undefined) {
      yield* session.attach(user)
      yield* remember(conn, { role: "hub", user })
    }
    if (session.view() === undefined) session.authTimer = yield* deadline(conn, Authenticate.NotInTime)

    // A tab that closed while the session moved: its calls are retried, as on any wake.
    // Made at once for a handed-over session, whose call ids go on from the old owner's.
    if (handedOver !== undefined && (yield* session.resume(handedOver))) session.changed()
    return session
  })
