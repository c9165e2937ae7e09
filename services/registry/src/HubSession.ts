/**
 * The actor of an MCP session at `/hub`, over either transport (`HubTransport.ts`): it
 * authenticates the client, follows its user's records through the replica's view (`Views.ts`),
 * lists them under unique names (`Naming.ts`) and pushes `list_changed` when they change. Its
 * `tools/call`s are `ToolCall.ts`'s; a tab's answer comes back through the tab's actor, told as
 * `Registry.FromTab`.
 */
import { Actors } from "@switchboard/bus"
import { Edge, JsonRpc, Registry } from "@switchboard/protocol"
import { Telemetry } from "@switchboard/telemetry"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import type * as Tracer from "effect/Tracer"
import * as HubTransport from "./HubTransport.ts"
import * as Naming from "./Naming.ts"
import { failure, LIST_CHANGED, result, sameJson } from "./Replies.ts"
import * as Replica from "./Replica.ts"
import * as ToolCall from "./ToolCall.ts"
import type * as Views from "./Views.ts"

const { ErrorCode } = JsonRpc
const CloseCode = Edge.CloseCode
/** The same message every time: a wake carries nothing. */
const WAKE = new Registry.Wake()
const isRecord = JsonRpc.isRecord

const SERVER_INFO = { name: "switchboard-registry", version: "0.1.0" }
const CAPABILITIES = {
  tools: { listChanged: true },
  // MCP-B's capability; under `experimental`, where MCP puts non-standard ones.
  experimental: { browser: { multiTabSupport: true, cacheSupported: true, elicitation: false } }
}

const decodeCallParams = Schema.decodeUnknownEither(Registry.ToolsCallParams)
const decodeListParams = Schema.decodeUnknownEither(Registry.ToolsListParams)
const decodeCancelled = Schema.decodeUnknownEither(Registry.CancelledParams)
const decodeInitialize = Schema.decodeUnknownEither(Registry.InitializeParams)

const sameList = (a: Naming.Aggregate, b: Naming.Aggregate) =>
  a === b || (a.tools.length === b.tools.length && sameJson(a.tools.map(Naming.toMcp), b.tools.map(Naming.toMcp)))

export const make = (replica: Replica.Replica) => (conn: Actors.Connection, restored: boolean, handedOver: unknown) =>
  Effect.gen(function*() {
    const { auth, config, deadline, forget, httpSessions, link, recall, remember, traced, views } = replica
    const scope = yield* Effect.scope
    /** Requests this actor started (a tab to open), which end with it; a set only once there is one. */
    let started: Set<Fiber.RuntimeFiber<unknown, unknown>> | undefined
    yield* Scope.addFinalizer(scope, Effect.suspend(() => (started === undefined ? Effect.void : Fiber.interruptAll(started))))
    // The service's runtime rather than a FiberSet per actor: one costs a Runtime and fiber refs
    // for every idle session (issue 16), while few sessions ever open a tab.
    const runFork = <A, E>(effect: Effect.Effect<A, E>) => {
      const fiber = replica.runService(effect)
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
    const transport = http ? yield* HubTransport.http(conn, link, config.http, ToolCall.handedStream(handedOver)) : HubTransport.webSocket(conn)
    let view: Views.View | undefined
    /** Set once `initialize` was answered. */
    let protocolVersion: string | undefined
    /** The list the client last saw (or was told changed), to push `list_changed` only on change. */
    let shown: Naming.Aggregate | undefined
    let wakeQueued = false
    /**
     * The session's tool calls, made with its first `tools/call` (or with the calls a hand-off
     * brought): most sessions sit idle, and their maps, timer and closures were a few KB of each
     * idle /hub socket (issue 16).
     */
    let calls: ToolCall.ToolCalls | undefined
    const makeCalls = Effect.map(Scope.extend(ToolCall.make(replica, { conn, view: () => view, user: () => user, runFork }), scope), (made) => {
      calls = made
      return made
    })

    const attach = (owner: string) =>
      Effect.gen(function*() {
        user = owner
        const v = yield* Scope.extend(views.acquire(owner), scope)
        view = v
        // Changes arrive outside the mailbox; they come back in as a message, in order with frames.
        const unlisten = v.listen(() => {
          if (wakeQueued) return
          wakeQueued = true
          Replica.peers.tell(conn, conn.id, WAKE)
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

    const toolsCall = (request: JsonRpc.Request, ex: HubTransport.Exchange, span: Tracer.Span | undefined) => {
      const params = decodeCallParams(request.params)
      if (Either.isLeft(params)) return ex.reply(failure(request.id, ErrorCode.InvalidParams, "Invalid params: tools/call expects {name: string, arguments?: object}"))
      calls?.start(request, params.right, ex, span)
    }

    const toolsList = (request: JsonRpc.Request, ex: HubTransport.Exchange) => {
      const all = view?.aggregate() ?? { tools: [] }
      const params = decodeListParams(isRecord(request.params) ? request.params : {})
      const offset = Either.isRight(params) && params.right.cursor !== undefined ? Number(params.right.cursor) : Either.isRight(params) ? 0 : -1
      if (offset < 0 || offset > all.tools.length) return ex.reply(failure(request.id, ErrorCode.InvalidParams, "Invalid params: unknown cursor"))
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
      const params = decodeInitialize(request.params ?? {})
      if (Either.isLeft(params)) {
        return ex.reply(failure(request.id, ErrorCode.InvalidParams, `Invalid params: initialize expects {protocolVersion: string} (${JsonRpc.shapeIssue(params.left)})`))
      }
      const asked = params.right.protocolVersion
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
      if (calls === undefined) return Effect.flatMap(makeCalls, () => onRequest(request, frame, ex) ?? Effect.void)
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
      if (message.method === "notifications/cancelled") {
        // A malformed cancel names no call this session could find: it is ignored, as MCP asks.
        const params = decodeCancelled(message.params)
        return Either.isRight(params) ? calls?.cancel(params.right) : undefined
      }
      // notifications/initialized and anything else a client announces need no answer.
    }

    const onWake = () => {
      wakeQueued = false
      const now = view?.aggregate()
      if (protocolVersion !== undefined && shown !== undefined && now !== undefined && !sameList(shown, now)) {
        shown = now
        transport.push(LIST_CHANGED)
      }
      calls?.tabsChanged()
    }

    const receive = (message: Registry.RegistryPeer): Effect.Effect<void> | void =>
      // A tab's answer to a session that never called a tool answers nothing here.
      message._tag === "FromTab" ? calls?.fromTab(message) : onWake()

    const onClosed = () =>
      Effect.suspend(() => {
        calls?.closed()
        transport.ended()
        return forget(conn)
      })

    const onHandoff = (): Registry.HubHandoff => {
      const stream = transport.handOff()
      return { role: "hub", ...(calls?.handOff() ?? { seq: 0, calls: [] }), ...(stream === undefined ? {} : { stream }) }
    }

    // A tab that closed while the session moved: its calls are retried, as on any wake.
    // Made at once for a handed-over session, whose call ids go on from the old owner's.
    if (handedOver !== undefined && (yield* makeCalls).resume(handedOver, transport) > 0) {
      wakeQueued = true
      Replica.peers.tell(conn, conn.id, WAKE)
    }

    return { onFrame, receive, onClosed, onHandoff } satisfies Actors.Actor<never, Registry.RegistryPeer>
  })
