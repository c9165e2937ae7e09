/**
 * The actor of an MCP client's socket (`/mcp`, the active role): `mcp_handshake`, then
 * `list_extensions`, `connect` and `disconnect`, answered by the proxy itself; every other request
 * goes to the connected extension under the id `<connection_id>:<id>`. The actor owns its pending
 * requests: the extension's actor (`ExtensionSession.ts`) passes each answer back as a peer message.
 */
import { type Actors, ActorTimer, type Peer, RateBudget, Subjects, TimedMap } from "@switchboard/bus"
import { Edge, JsonRpc, Proxy } from "@switchboard/protocol"
import { failure, notification, result } from "@switchboard/protocol/JsonRpc"
import { status } from "@switchboard/protocol/Proxy"
import { Telemetry } from "@switchboard/telemetry"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import type * as Tracer from "effect/Tracer"
import { randomUUID } from "node:crypto"
import * as Attachment from "./Attachment.ts"
import { relayed } from "./Replies.ts"
import { askAttached, peers, type ProbeOutcome, type Replica } from "./Replica.ts"

const { ErrorCode } = JsonRpc
const CloseCode = Edge.CloseCode
const decodeHandshake = Schema.decodeUnknownEither(Proxy.HandshakeParams)
const decodeConnect = Schema.decodeUnknownEither(Proxy.ConnectParams)

/** Why a session ends when its extension's actor no longer knows it (its `ExtensionGone` was lost). */
export const GONE = "Extension gone"

const isReserved = (id: JsonRpc.Id) => typeof id === "string" && Proxy.ReservedPrefixes.some((p) => id.startsWith(p))

/** A forwarded request awaiting the extension's answer, under its mapped id. */
interface Pending {
  readonly id: JsonRpc.Id
  readonly method: string
  readonly span: Tracer.AnySpan | undefined
}

/**
 * One MCP client's actor, once built. A class, so that every actor shares its handlers: as
 * closures over the actor's variables they were about twenty functions and their contexts per idle
 * socket (issue 16).
 */
class Client implements Actors.Actor<never, Proxy.RouterPeer, Proxy.HandoffState> {
  user: string | undefined
  session: Attachment.Session | undefined
  /** Closes a socket that does not authenticate in time; none for an adopted one that had. */
  deadline: ActorTimer.ActorTimer | undefined
  /** Requests forwarded and not answered yet; made with the session (a client not connected forwards nothing). */
  private pending: TimedMap<string, Pending> | undefined
  /** The socket's rate budget, made with its first forwarded request. */
  private budget: RateBudget | undefined
  /** Whether a probe is in flight, and until when a timed-out request starts none. */
  private probing = false
  private quietUntil = 0
  /** Whether the actor's scope already removes its entry from `probes`. */
  private tracked = false

  constructor(
    private readonly replica: Replica,
    private readonly conn: Actors.Connection,
    private readonly scope: Scope.Scope
  ) {}

  /** The map of requests in flight, made on first need. */
  pendingRequests(): Effect.Effect<TimedMap<string, Pending>> {
    if (this.pending !== undefined) return Effect.succeed(this.pending)
    const { inFlight, timedOut, timeoutMillis } = this.replica
    const expired = (_: string, p: Pending) => {
      this.send(failure(p.id, ErrorCode.ServerError, timedOut))
      this.probeAfterTimeout()
    }
    return Effect.map(Scope.extend(TimedMap.make(timeoutMillis, expired, inFlight), this.scope), (made) => (this.pending = made))
  }

  send(data: string, span?: Tracer.AnySpan) {
    this.conn.send(data, span === undefined ? undefined : Telemetry.traceHeaders(span).traceparent)
  }

  keepalive() {
    return this.replica.keepalive(this.scope, () => this.send(status(this.session !== undefined, this.session?.peerCount ?? 0)))
  }

  /** Fails everything in flight at once, as when the extension goes away. */
  private failPending(message: string) {
    const pending = this.pending
    if (pending === undefined) return
    for (const p of pending.values()) this.send(failure(p.id, ErrorCode.ServerError, message))
    pending.clear()
  }

  private endSession(reason: string, notify: boolean) {
    const ended = this.session
    if (ended === undefined) return
    this.session = undefined
    this.replica.probes.delete(this.conn.id)
    this.failPending(`Extension disconnected: ${reason}`)
    if (notify) this.send(notification("disconnected", { connection_id: ended.connectionId, reason } satisfies Proxy.DisconnectedParams))
    this.send(status(false, 0))
    return ended
  }

  private handshake(request: JsonRpc.Request) {
    const { auth, clientSeats, config, remember, seat } = this.replica
    return Effect.gen(this, function*() {
      // A socket is one user's for its whole life: a second token must not switch it to another.
      if (this.user !== undefined) return this.send(failure(request.id, ErrorCode.ServerError1, "MCP client already authenticated"))
      const params = decodeHandshake(request.params ?? {})
      // The spec answers every failed handshake with -32000, a missing or ill-typed token too.
      if (Either.isLeft(params)) return this.send(failure(request.id, ErrorCode.ServerError, `Authentication failed: ${JsonRpc.shapeIssue(params.left)}`))
      const claims = yield* Effect.either(auth.verify(params.right.token))
      if (Either.isLeft(claims)) return this.send(failure(request.id, ErrorCode.ServerError, `Authentication failed: ${claims.left.reason}`))
      const who = claims.right.sub
      if (!(yield* seat(clientSeats, who, this.scope))) {
        yield* Effect.logWarning(`refused an MCP client of ${who}: it has ${config.maxClientsPerUser} on this replica`)
        return this.send(failure(request.id, ErrorCode.ServerError, `Too many connections for this user (limit ${config.maxClientsPerUser} MCP clients)`))
      }
      this.deadline?.cancel()
      this.user = who
      yield* remember(this.conn, { role: "client", user: who })
      this.send(result(request.id, { authenticated: true, user_id: who, mcp_client_id: `mcp-${randomUUID()}` } satisfies Proxy.HandshakeResult))
    })
  }

  private listExtensions(request: JsonRpc.Request, owner: string) {
    return this.replica.extensions.values(Subjects.Key.userExtensions(owner)).pipe(
      Effect.map((found) => this.send(result(request.id, { extensions: found.map(({ value }) => ({ id: value.id, name: value.name, connected: true })) } satisfies Proxy.ExtensionsResult))),
      Effect.catchAll((e) =>
        Effect.zipRight(
          Effect.logWarning(`router: could not list the extensions of ${owner}`, e),
          Effect.sync(() => this.send(failure(request.id, ErrorCode.InternalError, "Internal error: could not list extensions")))
        )
      )
    )
  }

  private connect(request: JsonRpc.Request, owner: string) {
    const { conn, replica } = this
    return Effect.gen(this, function*() {
      if (this.session !== undefined) return this.send(failure(request.id, ErrorCode.ServerError1, "MCP client already connected to an extension"))
      const params = decodeConnect(request.params ?? {})
      if (Either.isLeft(params)) return this.send(failure(request.id, ErrorCode.InvalidParams, "Invalid params: extension_id (string) is required"))
      const attached = yield* Attachment.attach(replica, conn, owner, params.right.extension_id)
      if (Option.isNone(attached)) return this.send(failure(request.id, ErrorCode.ServerError, "Extension not found or not accessible"))
      const { name, session } = attached.value
      yield* this.pendingRequests()
      this.session = session
      yield* this.track()
      yield* Attachment.record(replica, conn, owner, attached.value)
      yield* replica.remember(conn, { role: "client", user: owner, connectionId: session.connectionId })
      this.send(result(request.id, { connection_id: session.connectionId, extension_id: session.extensionId, extension_name: name } satisfies Proxy.ConnectResult))
    })
  }

  private disconnect(request: JsonRpc.Request) {
    return Effect.gen(this, function*() {
      const ended = this.endSession("Client disconnected", false)
      if (ended !== undefined) {
        yield* this.detach(ended.connectionId, ended.extConn)
        if (this.user !== undefined) yield* this.replica.remember(this.conn, { role: "client", user: this.user })
      }
      this.send(result(request.id, { disconnected: true }))
    })
  }

  private detach(connectionId: string, extConn: Subjects.ConnId) {
    return Attachment.detach(this.replica, this.conn, connectionId, extConn)
  }

  /** Maps the id and sends the request to the extension; synchronous, once per forwarded request. */
  private forward(request: JsonRpc.Request, owner: string, span?: Tracer.Span): void {
    const { session, pending } = this
    if (session === undefined || pending === undefined) return this.send(failure(request.id, ErrorCode.ServerError, Proxy.NotConnected))
    const { config, userBudget } = this.replica
    const budget = (this.budget ??= new RateBudget(config.connectionRate, config.connectionRate * 2))
    if (budget.take() !== "ok" || userBudget(owner).take() !== "ok") {
      return this.send(failure(request.id, ErrorCode.ServerError, "Rate limit exceeded"))
    }
    if (pending.size >= config.maxPending) {
      return this.send(failure(request.id, ErrorCode.ServerError, `Too many pending requests (limit ${config.maxPending})`))
    }
    const mapped = `${session.connectionId}:${String(request.id)}`
    if (pending.has(mapped)) return this.send(failure(request.id, ErrorCode.InvalidRequest, `Invalid Request: id ${String(request.id)} is already in flight`))
    if (span !== undefined) span.attribute("mcp.mapped_id", mapped)
    pending.set(mapped, { id: request.id, method: request.method, span })
    session.extension.send(JSON.stringify(relayed(request, mapped)), span && Telemetry.traceHeaders(span).traceparent)
  }

  private onRequest(request: JsonRpc.Request, frame: Actors.Frame): Effect.Effect<void> | void {
    if (isReserved(request.id)) {
      return this.send(failure(request.id, ErrorCode.InvalidRequest, `Invalid Request: ids starting with "proxy:" or "ext:" are reserved`))
    }
    if (frame.limited) return this.send(failure(request.id, ErrorCode.ServerError, "Rate limit exceeded"))
    if (request.method === "mcp_handshake") return this.handshake(request)
    const owner = this.user
    if (owner === undefined) return this.send(failure(request.id, ErrorCode.ServerError, "Not authenticated: send mcp_handshake first"))
    switch (request.method) {
      case "list_extensions":
        return this.listExtensions(request, owner)
      case "connect":
        return this.connect(request, owner)
      case "disconnect":
        return this.disconnect(request)
    }
    if (!this.replica.traced) return this.forward(request, owner)
    const session = this.session
    return Effect.currentSpan.pipe(
      Effect.map((span) => this.forward(request, owner, span)),
      Effect.withSpan(`router.forward ${request.method}`, {
        kind: "server",
        attributes: {
          "rpc.method": request.method,
          "mcp.request.id": String(request.id),
          "sb.conn": this.conn.id,
          "user_id": owner,
          ...(session === undefined ? {} : { connection_id: session.connectionId })
        }
      }),
      Telemetry.withRemoteParent(frame.traceparent),
      Effect.ignore
    )
  }

  /**
   * Asks the extension's actor whether this session is still attached to it, in a fiber of its
   * own: the mailbox goes on meanwhile. If it is gone, the session ends through the mailbox, as
   * the `ExtensionGone` that was lost would have ended it, and only if it is the same session
   * by then. No answer in time proves nothing (NATS may be slow): the session carries on.
   */
  probe(): Effect.Effect<ProbeOutcome> {
    return Effect.suspend(() => {
      const { conn, replica: { config, extensions } } = this
      const s = this.session
      if (s === undefined) return Effect.succeed<ProbeOutcome>("attached")
      this.probing = true
      const { connectionId, extConn } = s
      // `user` is set before any session is.
      const record = this.user === undefined ? Effect.fail("no user") : extensions.get(Subjects.Key.userExtension(this.user, s.extensionId))
      return askAttached(conn, extConn, connectionId, config.probeTimeout, record, (ext) => ext.conn === extConn).pipe(
        Effect.tap((outcome) => {
          if (outcome === "gone") peers.tell(conn, conn.id, new Proxy.ExtensionGone({ connectionId, reason: GONE }))
          return Effect.logDebug(`router: probed extension conn ${extConn} for ${connectionId}: ${outcome}`)
        }),
        Effect.ensuring(Effect.sync(() => void (this.probing = false)))
      )
    })
  }

  /**
   * A forwarded request timed out, perhaps because the extension's actor is gone: one probe for
   * a burst of timeouts, and none again for a timeout period after it.
   */
  private probeAfterTimeout() {
    if (this.session === undefined || this.probing || Date.now() < this.quietUntil) return
    this.quietUntil = Date.now() + this.replica.timeoutMillis
    this.replica.runFork(this.probe())
  }

  /** Enters the session in the replica's `probes` on each `connect` (see `Replica.track`). */
  track(): Effect.Effect<void> {
    const first = !this.tracked
    this.tracked = true
    return this.replica.track(this.conn.id, this.scope, () => this.probe(), first)
  }

  onFrame(frame: Actors.Frame): Effect.Effect<void> | void {
    const decoded = JsonRpc.decodeFrame(frame.text)
    if (Either.isLeft(decoded)) return this.send(JsonRpc.encode(decoded.left))
    const incoming = decoded.right
    if (incoming._tag === "Request") return this.onRequest(incoming.message, frame)
    if (incoming._tag === "Notification" && this.session !== undefined && this.user !== undefined) {
      this.session.extension.send(JSON.stringify(relayed(incoming.message)))
    }
    // A client answers nothing; its stray responses and notifications before connect go nowhere.
  }

  /** The extension's answer, as the extension's actor passed it on. */
  private onAnswer({ response }: Proxy.Answer): Effect.Effect<void> | void {
    const mapped = response.id
    if (typeof mapped !== "string") return
    const p = this.pending?.get(mapped)
    if (p === undefined) return // late: timed out, or the client disconnected since
    this.pending?.delete(mapped)
    // One that was no response is already -32603 (the extension's actor made it so).
    const answer = JSON.stringify(relayed(response, p.id))
    if (p.span === undefined) return this.send(answer)
    return Effect.currentSpan.pipe(
      Effect.map((span) => this.send(answer, span)),
      Effect.withSpan(`router.reply ${p.method}`, {
        kind: "server",
        parent: p.span,
        attributes: {
          "rpc.method": p.method,
          "mcp.request.id": String(p.id),
          "mcp.mapped_id": mapped,
          "sb.conn": this.conn.id,
          "connection_id": mapped.slice(0, mapped.indexOf(":")),
          "user_id": this.user ?? ""
        }
      }),
      Effect.ignore
    )
  }

  /** A field, not a method: the host hands it on unbound. */
  readonly receive = (message: Proxy.RouterPeer, reply: Peer.ReplyTo): Effect.Effect<void> | void => {
    const session = this.session
    switch (message._tag) {
      case "Probe":
        // The extension's actor, back on NATS, checks that its client did not leave unheard.
        return reply(message).succeed({ attached: session?.connectionId === message.connectionId })
      case "Answer":
        return this.onAnswer(message)
      case "ExtensionGone":
        if (session?.connectionId !== message.connectionId) return
        this.endSession(message.reason, true)
        if (this.user !== undefined) return this.replica.remember(this.conn, { role: "client", user: this.user })
        return
      case "PeerStatus":
        if (session?.connectionId !== message.connectionId) return
        session.peerCount = message.peerCount
        return this.send(status(true, session.peerCount))
    }
  }

  onClosed() {
    return Effect.suspend(() => {
      this.pending?.clear()
      const ended = this.session
      this.session = undefined
      this.replica.probes.delete(this.conn.id)
      return Effect.zipRight(ended === undefined ? Effect.void : this.detach(ended.connectionId, ended.extConn), this.replica.forget(this.conn))
    })
  }

  onHandoff(): Proxy.HandoffState {
    return {
      role: "client",
      pending: this.pending === undefined ? [] : [...this.pending.entries()].map(([mapped, p]) => ({ mapped, id: p.id, method: p.method }))
    }
  }
}

export const make = (replica: Replica) => {
  const { clientSeats, config, recall, seat } = replica
  return (conn: Actors.Connection, restored: boolean, handedOver: Proxy.HandoffState | undefined) =>
    Effect.gen(function*() {
      const scope = yield* Effect.scope
      const actor = new Client(replica, conn, scope)
      // Adopted from a replica that stopped: requests in flight there are lost (the client times
      // them out), but the handshake and the connection to the extension carry on.
      const saved = restored ? yield* recall(conn) : Option.none()
      if (Option.isSome(saved) && saved.value.role === "client") {
        const user = saved.value.user
        actor.user = user
        yield* seat(clientSeats, user, scope, true)
        const connectionId = saved.value.connectionId
        if (connectionId !== undefined) actor.session = Option.getOrUndefined(yield* Attachment.restore(replica, connectionId))
      }
      // An anonymous socket would hold its place forever: as on /extension, authenticating has a
      // deadline. Failed attempts don't extend it; an adopted socket that had authenticated has none.
      if (actor.user === undefined) {
        actor.deadline = yield* ActorTimer.after(config.authTimeout, () => conn.close(CloseCode.PolicyViolation, "Authentication failed: no mcp_handshake in time"))
      }
      // Requests in flight at the replica that handed this socket over: their answers come here.
      const handedPending = handedOver?.role === "client" ? handedOver.pending : []
      if (actor.session !== undefined || handedPending.length > 0) {
        const pending = yield* actor.pendingRequests()
        for (const { id, mapped, method } of handedPending) pending.set(mapped, { id, method, span: undefined })
      }
      if (actor.session !== undefined) yield* actor.track()
      yield* actor.keepalive()
      return actor
    })
}
