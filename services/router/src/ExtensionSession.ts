/**
 * The actor of a browser extension's socket (`/extension`, the passive role): the proxy asks it to
 * `authenticate`, lists it under its user in KV, and passes its answers on to the client actors
 * attached to it (`ClientSession.ts`) as peer messages. Other services' requests reach it through
 * `InternalRequests.ts`; it asks the extension as the proxy itself, with `proxy:` ids.
 */
import { type Actors, ActorTimer, type Peer, Subjects, TimedMap } from "@switchboard/bus"
import { Edge, Json, JsonRpc, Proxy } from "@switchboard/protocol"
import * as Cdp from "@switchboard/protocol/browser/Cdp"
import { failure, notification } from "@switchboard/protocol/JsonRpc"
import { status } from "@switchboard/protocol/Proxy"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import { orWarn, refused, warnIfFails } from "./Replies.ts"
import { askAttached, peers, type ProbeOutcome, type Replica } from "./Replica.ts"

const { ErrorCode } = JsonRpc
const CloseCode = Edge.CloseCode
const decoder = new TextDecoder()
const isRecord = JsonRpc.isRecord
/**
 * The extension's answer to a forwarded or internal request, as a JSON-RPC response: one that is
 * none (no result and no error, both, a malformed error) is the extension's fault, -32603 under
 * the same mapped id, so that whoever asked gets an answer either way.
 */
const answerOf = (id: string, message: Record<string, unknown>): JsonRpc.Response => {
  const decoded = JsonRpc.decodeValue(message)
  if (Either.isRight(decoded) && decoded.right._tag === "Response") return decoded.right.message
  const why = "result" in message || "error" in message ? "a malformed response" : "neither result nor error"
  return JsonRpc.errorResponse(id, ErrorCode.InternalError, `Internal error: the extension answered with ${why}`)
}
const decodeAuthResult = Schema.decodeUnknownEither(Proxy.AuthenticateResult)

/** The id of the proxy's one `authenticate` request to each extension. */
export const AUTH_REQUEST_ID = "proxy:1"
const AUTH_REQUEST = JSON.stringify({ jsonrpc: "2.0", id: AUTH_REQUEST_ID, method: "authenticate", params: {} })
/** Ids of the requests the proxy itself sends to an extension; clients may never use them. */
const PROXY_ID_PREFIX = "proxy:"
/** Close codes whose reason tells a client why its extension went away. */
const GIVEN_REASONS: ReadonlySet<number> = new Set([
  CloseCode.ProtocolError,
  CloseCode.Unsupported,
  CloseCode.PolicyViolation,
  CloseCode.TooBig,
  CloseCode.InternalError,
  CloseCode.TryAgainLater
])
/** The shape of the connection ids `connect` mints; anything else in a reply's id was never sent. */
const CONNECTION_ID = /^conn-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/
/** An id a peer sent, for a log line: quoted, and cut short, since it can be as long as a frame. */
const shown = (id: string) => JSON.stringify(id.length > 80 ? `${id.slice(0, 80)}…` : id)

/**
 * One extension's actor, once built. A class, so that every actor shares its handlers: as closures
 * over the actor's variables they were about a dozen functions and their contexts per idle socket
 * (issue 16).
 */
class Extension implements Actors.Actor<never, Proxy.RouterPeer, Proxy.HandoffState> {
  /** Set once the extension authenticated (or was adopted so). */
  ext: Proxy.ExtensionRecord | undefined
  /** Proxy connections attached to this extension: connection id → the client's socket. */
  readonly attached = new Map<string, { readonly conn: Subjects.ConnId }>()
  /** Internal requests sent to the extension: `proxy:` id → the asker's reply; made with the first. */
  private internal: TimedMap<string, Peer.Reply<Proxy.InternalRequest>> | undefined
  /** Closes the socket unless the extension answers `authenticate` in time. */
  timeout: ActorTimer.ActorTimer | undefined
  /** Whether the actor's scope already removes its entry from `probes`. */
  private tracked = false

  constructor(
    private readonly replica: Replica,
    private readonly conn: Actors.Connection,
    private readonly scope: Scope.Scope
  ) {}

  /** The map of internal requests, made on first need: few extensions are ever asked by another service. */
  internalRequests(): Effect.Effect<TimedMap<string, Peer.Reply<Proxy.InternalRequest>>> {
    if (this.internal !== undefined) return Effect.succeed(this.internal)
    const { inFlight, internalMillis, internalTimedOut, runFork } = this.replica
    const expired = (_: string, reply: Peer.Reply<Proxy.InternalRequest>) => runFork(reply.fail(refused(ErrorCode.ServerError, internalTimedOut)))
    return Effect.map(Scope.extend(TimedMap.make(internalMillis, expired, inFlight), this.scope), (made) => (this.internal = made))
  }

  private announce() {
    const { attached, conn } = this
    conn.send(status(true, attached.size))
    for (const [connectionId, client] of attached) {
      peers.tell(conn, client.conn, new Proxy.PeerStatus({ connectionId, peerCount: attached.size }))
    }
  }

  keepalive() {
    return this.replica.keepalive(this.scope, () => this.conn.send(status(true, this.attached.size)))
  }

  private authenticate(response: Record<string, unknown>) {
    const { conn, replica } = this
    const { auth, config, extensions, extensionSeats, link, remember, seat } = replica
    return Effect.gen(this, function*() {
      if (!("result" in response)) {
        return conn.close(CloseCode.PolicyViolation, "Authentication failed: authenticate was refused")
      }
      const answer = decodeAuthResult(response["result"])
      if (Either.isLeft(answer)) {
        return conn.close(CloseCode.PolicyViolation, `Authentication failed: expected {name, accessToken} (${JsonRpc.shapeIssue(answer.left)})`)
      }
      const claims = yield* Effect.either(auth.verify(answer.right.token))
      if (Either.isLeft(claims)) return conn.close(CloseCode.PolicyViolation, `Authentication failed: ${claims.left.reason}`)
      const user = claims.right.sub
      if (!(yield* seat(extensionSeats, user, this.scope))) {
        yield* Effect.logWarning(`refused an extension of ${user}: it has ${config.maxExtensionsPerUser} on this replica`)
        return conn.close(CloseCode.PolicyViolation, `Too many connections for this user (limit ${config.maxExtensionsPerUser} extensions)`)
      }
      this.timeout?.cancel()
      const clientId = answer.right.clientId
      const id = clientId === undefined ? `ext-${randomUUID()}` : yield* this.stableId(user, clientId)
      const key = Subjects.Key.userExtension(user, id)
      // Last one wins: the same browser reconnecting replaces its older socket.
      const previous = yield* extensions.get(key)
      if (Option.isSome(previous) && previous.value.value.conn !== conn.id) {
        const old = previous.value.value
        link.closeAndEnd("router", Subjects.EdgeId(old.edge), Subjects.ConnId(old.conn), CloseCode.Normal, "replaced by a newer connection")
      }
      const ext: Proxy.ExtensionRecord = {
        id,
        name: answer.right.name,
        user,
        conn: conn.id,
        edge: conn.edge,
        connectedAt: Date.now(),
        ...(clientId === undefined ? {} : { clientId })
      }
      this.ext = ext
      yield* extensions.put(key, ext)
      yield* remember(conn, { role: "extension", user, extensionId: id })
      conn.send(notification("authenticated", { user_id: user, extension_id: id } satisfies Proxy.AuthenticatedParams))
      conn.send(status(true, 0))
      yield* this.keepalive()
      yield* Effect.logDebug(`extension ${id} of ${user} authenticated`)
    }).pipe(
      Effect.catchAll((e) =>
        Effect.zipRight(
          Effect.logWarning("router: could not register an extension", e),
          Effect.sync(() => conn.close(CloseCode.InternalError, `could not register the extension: ${e.message}`))
        )
      )
    )
  }

  private stableId(user: string, clientId: string) {
    const { extensionIds } = this.replica
    return Effect.gen(function*() {
      const key = Subjects.Key.extensionId(user, clientId)
      const fresh = `ext-${randomUUID()}`
      const claimed = yield* Effect.either(extensionIds.create(key, fresh))
      if (Either.isRight(claimed)) return fresh
      const existing = yield* extensionIds.get(key)
      return Option.match(existing, { onNone: () => fresh, onSome: (e) => decoder.decode(e.value) })
    })
  }

  /** Asks the extension on behalf of another service; the answer comes back through `settle`. */
  private askInternal(request: Proxy.InternalRequest, reply: Peer.Reply<Proxy.InternalRequest>) {
    const ext = this.ext
    if (ext === undefined) return reply.fail(refused(ErrorCode.ServerError, "Not authenticated: the extension has not answered authenticate"))
    // The record the router looked up may be stale: answer only for the extension's own user.
    if (request.user !== ext.user) return reply.fail(refused(ErrorCode.ServerError, "No browser extension is connected for this user"))
    const { method, params } = request
    return Effect.map(this.internalRequests(), (internal) => {
      const id = `${PROXY_ID_PREFIX}${randomUUID()}`
      internal.set(id, reply)
      this.conn.send(JSON.stringify(params === undefined ? { jsonrpc: "2.0", id, method } : { jsonrpc: "2.0", id, method, params }))
    })
  }

  /** The extension's answer to an internal request; late and unknown ones are dropped. */
  private settle(id: string, response: JsonRpc.Response): Effect.Effect<void> | void {
    const asked = this.internal?.get(id)
    if (asked === undefined) return
    this.internal?.delete(id)
    return "error" in response ? asked.fail(refused(response.error.code, response.error.message)) : asked.succeed(response.result)
  }

  /**
   * Passes a CDP event on to the client that drives its tab, and only to it: the extension names
   * the client's proxy connection, which must be attached to this very extension.
   */
  private cdpEvent(params: unknown) {
    if (this.ext === undefined || !isRecord(params)) return
    const { connection_id, method, sessionId, tabId } = params
    const client = typeof connection_id === "string" ? this.attached.get(connection_id) : undefined
    if (client === undefined || typeof tabId !== "number" || typeof method !== "string") return
    const event: Proxy.CdpEvent = {
      _tag: "CdpEvent",
      tabId,
      method,
      ...(typeof sessionId === "string" ? { sessionId } : {}),
      ...(isRecord(params["params"]) ? { params: params["params"] } : {})
    }
    peers.tell(this.conn, client.conn, event)
  }

  onFrame(frame: Actors.Frame): Effect.Effect<void> | void {
    const conn = this.conn
    const parsed = Json.parse(frame.text)
    if (Either.isLeft(parsed)) return conn.send(failure(null, ErrorCode.ParseError, `Parse error: ${parsed.left}`))
    const message = parsed.right
    if (!isRecord(message)) return conn.send(failure(null, ErrorCode.InvalidRequest, "Invalid Request: expected a JSON object"))
    const id = message["id"]
    if ("method" in message) {
      // The extension is passive; it has nothing to ask of the proxy. Its one notification is a
      // CDP event of a tab that a CDP client drives.
      if (id === undefined) return message["method"] === Cdp.Method.event ? this.cdpEvent(message["params"]) : undefined
      const request = JsonRpc.decodeValue(message)
      // Not a valid request (a method that is no string, say): the decoder's -32600 says why.
      if (Either.isLeft(request)) return conn.send(JsonRpc.encode(request.left))
      if (request.right._tag !== "Request") return
      const { id: asked, method } = request.right.message
      return conn.send(failure(asked, ErrorCode.MethodNotFound, `Method not found: ${method}`))
    }
    const self = this.ext
    if (id === AUTH_REQUEST_ID) return self === undefined ? this.authenticate(message) : undefined
    if (self === undefined) return conn.send(failure(null, ErrorCode.ServerError, "Not authenticated: answer the authenticate request first"))
    if (typeof id !== "string") {
      return conn.send(failure(null, ErrorCode.InvalidRequest, "Invalid Request: a response to a forwarded request carries its mapped string id"))
    }
    const response = answerOf(id, message)
    if (id.startsWith(PROXY_ID_PREFIX)) return this.settle(id, response)
    const colon = id.indexOf(":")
    const connectionId = colon < 0 ? id : id.slice(0, colon)
    const client = this.attached.get(connectionId)
    if (client !== undefined) return peers.tell(conn, client.conn, { _tag: "Answer", response })
    const who = `extension ${self.id} of ${self.user} (conn ${conn.id})`
    if (!CONNECTION_ID.test(connectionId)) return Effect.logWarning(`router: dropped a reply from ${who} to ${shown(id)}: no connection has that id`)
    // Attached through another replica's view, or a late answer after a disconnect. Anyone can
    // write a connection id, so the record must name this very socket and user: otherwise
    // another extension could answer a request that was never sent to it.
    return this.replica.proxies.get(Subjects.Key.proxyConnection(connectionId)).pipe(
      Effect.flatMap(Option.match({
        onNone: () => Effect.void,
        onSome: ({ value: p }) =>
          p.extensionConn === conn.id && p.user === self.user
            ? Effect.sync(() => peers.tell(conn, Subjects.ConnId(p.clientConn), { _tag: "Answer", response }))
            : Effect.logWarning(
              `router: dropped a reply from ${who} to ${shown(id)}: ${connectionId} is the connection of ${p.user}'s client (conn ${p.clientConn}) ` +
                `to extension ${p.extensionId} (conn ${p.extensionConn})`
            )
      })),
      warnIfFails(`could not look up ${connectionId} for a reply from ${who}`)
    )
  }

  /**
   * After this replica's NATS connection came back: a client's `Detach` may have been lost
   * meanwhile, leaving a client here that is gone (a wrong `peer_count`, answers sent to
   * nobody). Each attached client's actor is asked, as it asks this one; one that says no, or
   * a connection nobody listens on whose record is gone too, is detached through this actor's
   * own mailbox, as a `Detach` would be. One client at a time: the replica bounds how many
   * actors check at once.
   */
  recheck(): Effect.Effect<ProbeOutcome> {
    const { conn, replica } = this
    return Effect.forEach([...this.attached], ([connectionId, client]) =>
      askAttached(conn, client.conn, connectionId, replica.config.probeTimeout, replica.proxies.get(Subjects.Key.proxyConnection(connectionId)), (p) => p.extensionConn === conn.id).pipe(
        Effect.tap((outcome) => (outcome === "gone" ? Effect.sync(() => peers.tell(conn, conn.id, new Proxy.Detach({ connectionId }))) : Effect.void))
      )).pipe(
        Effect.map((outcomes): ProbeOutcome => (outcomes.includes("gone") ? "gone" : outcomes.includes("unknown") ? "unknown" : "attached")),
        Effect.tap((outcome) => Effect.logDebug(`router: rechecked the clients of extension conn ${conn.id}: ${outcome}`))
      )
  }

  /** Enters the extension in the replica's `probes` once a client attaches (see `Replica.track`). */
  track(): Effect.Effect<void> {
    if (this.tracked) return Effect.void
    this.tracked = true
    return this.replica.track(this.conn.id, this.scope, () => this.recheck(), true)
  }

  /** A field, not a method: the host hands it on unbound. */
  readonly receive = (message: Proxy.RouterPeer, reply: Peer.ReplyTo): Effect.Effect<void> | void => {
    const ext = this.ext
    switch (message._tag) {
      case "Attach": {
        if (ext === undefined || message.user !== ext.user) {
          return reply(message).fail(new Proxy.AttachRefused({ reason: "Extension not found or not accessible" }))
        }
        this.attached.set(message.connectionId, { conn: Subjects.ConnId(message.clientConn) })
        const answered = reply(message).succeed({ name: ext.name, peerCount: this.attached.size })
        return Effect.zipRight(answered, Effect.zipRight(this.track(), Effect.sync(() => this.announce())))
      }
      case "Probe":
        // A client that asks may have missed our `ExtensionGone`, or we its `Detach`; either
        // way only what this actor holds now counts.
        return reply(message).succeed({ attached: ext !== undefined && this.attached.has(message.connectionId) })
      case "Detach":
        if (this.attached.delete(message.connectionId)) this.announce()
        return
      case "InternalRequest":
        return this.askInternal(message, reply(message))
    }
  }

  onClosed(code: number, reason: string) {
    const { attached, conn, replica } = this
    return Effect.gen(this, function*() {
      // A close the edge or the router made for a reason (a frame too large, a policy) says so,
      // since the client otherwise only learns that its extension is gone.
      const why = code === CloseCode.Normal && reason.startsWith("replaced")
        ? "Extension reconnected"
        : GIVEN_REASONS.has(code) && reason !== ""
        ? `Extension closed: ${reason}`
        : "Extension closed"
      const unanswered = this.internal === undefined ? [] : [...this.internal.values()]
      this.internal?.clear()
      yield* Effect.forEach(unanswered, (reply) => reply.fail(refused(ErrorCode.ServerError, "Extension disconnected")), { discard: true })
      for (const [connectionId, client] of attached) {
        peers.tell(conn, client.conn, new Proxy.ExtensionGone({ connectionId, reason: why }))
      }
      attached.clear()
      yield* replica.forget(conn)
      const ext = this.ext
      if (ext === undefined) return
      // A newer socket of the same browser may own the record already, or write it while this one
      // lets go (a chaos run lost the record so, and with it every connect for minutes).
      yield* replica.extensions.deleteOwned(Subjects.Key.userExtension(ext.user, ext.id), (record) => record.conn === conn.id)
    }).pipe(warnIfFails("could not remove a closed extension's record; it stays listed until it is replaced"))
  }

  onHandoff(): Proxy.HandoffState {
    return {
      role: "extension",
      // An asker on this replica cannot follow the request to another; it times out instead.
      internal: this.internal === undefined ? [] : [...this.internal.entries()].flatMap(([id, r]) => (r.subject === undefined ? [] : [{ id, reply: r.subject }]))
    }
  }
}

export const make = (replica: Replica) => {
  const { config, extensions, proxies, recall, seat } = replica
  /** Where an internal request's answer goes, for one handed over from another replica. */
  const replyTo = (subject: string) => peers.replyAt(replica.bus, Proxy.InternalRequest, subject)
  return (conn: Actors.Connection, restored: boolean, handedOver: Proxy.HandoffState | undefined) =>
    Effect.gen(function*() {
      const scope = yield* Effect.scope
      const actor = new Extension(replica, conn, scope)
      if (handedOver?.role === "extension" && handedOver.internal.length > 0) {
        const internal = yield* actor.internalRequests()
        for (const { id, reply } of handedOver.internal) internal.set(id, replyTo(reply))
      }

      // Adopted from a replica that stopped: the extension authenticated long ago.
      const saved = restored ? yield* recall(conn) : Option.none()
      if (Option.isSome(saved) && saved.value.role === "extension") {
        const { user, extensionId } = saved.value
        const record = yield* extensions.get(Subjects.Key.userExtension(user, extensionId)).pipe(
          orWarn(`could not read extension ${extensionId} of ${user} to adopt its socket`, Option.none())
        )
        if (Option.isSome(record) && record.value.value.conn === conn.id) {
          actor.ext = record.value.value
          yield* seat(replica.extensionSeats, user, scope, true)
          const all = yield* proxies.values().pipe(orWarn(`could not read the proxy connections of adopted extension ${extensionId}`, []))
          for (const { value: p } of all) {
            if (p.extensionConn === conn.id) actor.attached.set(p.connectionId, { conn: Subjects.ConnId(p.clientConn) })
          }
          yield* actor.keepalive()
        }
      }
      if (actor.ext === undefined) {
        conn.send(AUTH_REQUEST)
        actor.timeout = yield* ActorTimer.after(config.authTimeout, () => conn.close(CloseCode.PolicyViolation, "Authentication failed: no answer to authenticate"))
      }
      if (actor.attached.size > 0) yield* actor.track()
      return actor
    })
}
