/**
 * The session router: the MCP Proxy Protocol between MCP clients (`/mcp`, active) and browser
 * extensions (`/extension`, passive). Each socket is an actor. A client's actor owns its pending
 * requests: it maps ids to `<connection_id>:<id>`, sends straight to the extension's socket, and
 * gets the answer back from the extension's actor as a peer message, wherever either one lives.
 * Other services reach an extension through `router.internal` (see `InternalClient`): the
 * extension's actor then asks it as the proxy itself, with `proxy:` ids, and owns those requests.
 */
import { AuthClient } from "@switchboard/auth"
import { Actors, ActorTimer, Bus, ConnectionLimit, Kv, Peer, RateBudget, Subjects, TimedMap } from "@switchboard/bus"
import { Edge, Json, JsonRpc, Proxy } from "@switchboard/protocol"
import { Instruments, Metrics, Telemetry } from "@switchboard/telemetry"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as FiberSet from "effect/FiberSet"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import type * as Tracer from "effect/Tracer"
import { randomUUID } from "node:crypto"
import * as RouterConfig from "./Config.ts"

const { ErrorCode } = JsonRpc
const CloseCode = Edge.CloseCode
const decoder = new TextDecoder()

/** What the router's actors, and other services through `router.internal`, say to its actors. */
const peers = Peer.protocol(Proxy.RouterPeer)
const decodeErrorObject = Schema.decodeUnknownEither(JsonRpc.ErrorObject)
const decodeAuthResult = Schema.decodeUnknownEither(Proxy.AuthenticateResult)
const decodeHandshake = Schema.decodeUnknownEither(Proxy.HandshakeParams)
const decodeConnect = Schema.decodeUnknownEither(Proxy.ConnectParams)

const notification = (method: string, params: Record<string, unknown>) => JSON.stringify({ jsonrpc: "2.0", method, params })
const result = (id: JsonRpc.Id, value: unknown) => JSON.stringify({ jsonrpc: "2.0", id, result: value })
const failure = (id: JsonRpc.Id | null, code: number, message: string) =>
  JsonRpc.encode(JsonRpc.errorResponse(id, code, message))
const status = (connected: boolean, peerCount: number) =>
  notification("status", { connected, peer_count: peerCount, timestamp: new Date().toISOString() })

const isRecord = JsonRpc.isRecord
const parse = Json.parse
/**
 * A message just parsed from a frame, readied to be passed on (under another id, if given):
 * `jsonrpc` filled in, and the spec's optional `connectionId` routing field dropped, so it never
 * reaches the extension. Changed in place, since the parse made it for this one use.
 */
const relayed = (message: object, id?: JsonRpc.Id): object => {
  const fields = message as Record<string, unknown>
  if (id !== undefined) fields["id"] = id
  if (fields["jsonrpc"] === undefined) fields["jsonrpc"] = "2.0"
  if ("connectionId" in fields) delete fields["connectionId"]
  return fields
}
const isReserved = (id: JsonRpc.Id) => typeof id === "string" && Proxy.ReservedPrefixes.some((p) => id.startsWith(p))
const tokenOf = (p: { readonly accessToken?: string | undefined; readonly access_token?: string | undefined }) =>
  p.accessToken ?? p.access_token

const AUTH_REQUEST_ID = "proxy:1"
const AUTH_REQUEST = JSON.stringify({ jsonrpc: "2.0", id: AUTH_REQUEST_ID, method: "authenticate", params: {} })
/** Ids of the requests the proxy itself sends to an extension; clients may never use them. */
const PROXY_ID_PREFIX = "proxy:"
const refused = (code: number, message: string) => new Proxy.InternalFailure({ code, message })
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

/** Work the actor carries on without when it fails (a KV write, a reply); the failure is logged. */
const warnIfFails = (what: string) => <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A | void, never, R> =>
  Effect.catchAll(self, (e) => Effect.logWarning(`router: ${what}`, e))
/** A read the actor survives without, taking `fallback` instead; the failure is logged. */
const orWarn = <B>(what: string, fallback: B) => <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A | B, never, R> =>
  Effect.catchAll(self, (e) => Effect.as(Effect.logWarning(`router: ${what}`, e), fallback))

export const make = Effect.gen(function*() {
  const bus = yield* Bus.Bus
  const kv = yield* Kv.Kv
  const auth = yield* AuthClient.AuthClient
  const { tracer } = yield* Telemetry.Tracing
  const traced = Option.isSome(tracer)
  const inFlight = Instruments.requests(yield* Metrics.Metrics, "router")
  const link = yield* Actors.edgeLink
  const config = {
    requestTimeout: yield* RouterConfig.requestTimeout,
    authTimeout: yield* RouterConfig.authTimeout,
    internalTimeout: yield* RouterConfig.internalTimeout,
    statusInterval: yield* RouterConfig.statusInterval,
    maxPending: yield* RouterConfig.maxPending,
    connectionRate: yield* RouterConfig.connectionRate,
    userRate: yield* RouterConfig.userRate,
    maxClientsPerUser: yield* RouterConfig.maxClientsPerUser,
    maxExtensionsPerUser: yield* RouterConfig.maxExtensionsPerUser,
    replicaHeartbeat: yield* RouterConfig.replicaHeartbeat,
    shutdownGrace: yield* RouterConfig.shutdownGrace
  }
  const timeoutMillis = Duration.toMillis(config.requestTimeout)
  const timedOut = `Request timed out after ${Duration.format(config.requestTimeout)}`
  const internalMillis = Duration.toMillis(config.internalTimeout)
  const internalTimedOut = `Request timed out after ${Duration.format(config.internalTimeout)}`
  /** Runs work that starts outside any Effect (bus callbacks, timers) until the router stops. */
  const runFork = yield* FiberSet.makeRuntime<never>()
  const extensions = Kv.typed(yield* kv.bucket(Subjects.Bucket.extensions), Proxy.ExtensionRecord)
  const extensionIds = yield* kv.bucket(Subjects.Bucket.extensionIds)
  const proxies = Kv.typed(yield* kv.bucket(Subjects.Bucket.proxyConnections), Proxy.ProxyConnectionRecord)
  const { forget, recall, remember } = Actors.sessionStore(Kv.typed(yield* kv.bucket(Subjects.Bucket.sessions), Proxy.SessionRecord))
  /** Per-user budgets are per replica: exact across replicas would cost a KV write per request. */
  const userBudgets = new Map<string, RateBudget>()
  const userBudget = (user: string) => {
    let b = userBudgets.get(user)
    if (!b) userBudgets.set(user, (b = new RateBudget(config.userRate, config.userRate * 2)))
    return b
  }
  // The edge cannot cap these users' sockets: on `/mcp` and `/extension` it learns the user only
  // in-band. Counted in memory, per replica: exact across replicas would cost a KV write per socket.
  const clientSeats = new ConnectionLimit(config.maxClientsPerUser)
  const extensionSeats = new ConnectionLimit(config.maxExtensionsPerUser)
  /**
   * Takes one of `user`'s seats until `scope` closes; false, taking nothing, at the cap. `force`
   * takes one regardless: a socket adopted from another replica was admitted there.
   */
  const seat = (seats: ConnectionLimit, user: string, scope: Scope.Scope, force = false) =>
    Effect.suspend(() => {
      const release = seats.take(user, force)
      return release === undefined ? Effect.succeed(false) : Effect.as(Scope.addFinalizer(scope, Effect.sync(release)), true)
    })
  // A budget outlives its user's clients by at most a minute, so users who come and go leave none.
  yield* Effect.sync(() => {
    for (const user of userBudgets.keys()) if (clientSeats.count(user) === 0) userBudgets.delete(user)
  }).pipe(Effect.repeat(Schedule.spaced("1 minute")), Effect.forkScoped)
  /** The status keepalive, for as long as the connection's scope lives (a timer, not a fiber: issue 16). */
  const keepalive = (scope: Scope.Scope, send: () => void) => Scope.extend(ActorTimer.every(config.statusInterval, send), scope)

  // --- the extension's actor ---------------------------------------------------------------

  const decodeHandoff = Schema.decodeUnknownOption(Proxy.HandoffState)
  /** Where an internal request's answer goes, for one handed over from another replica. */
  const replyTo = (subject: string) => peers.replyAt(bus, Proxy.InternalRequest, subject)

  const extensionActor = (conn: Actors.Connection, restored: boolean, handedOver: unknown) =>
    Effect.gen(function*() {
      const scope = yield* Effect.scope
      let ext: Proxy.ExtensionRecord | undefined
      /** Proxy connections attached to this extension: connection id → the client's socket. */
      const attached = new Map<string, { readonly conn: Subjects.ConnId }>()
      /** Internal requests sent to the extension: `proxy:` id → the asker's reply. */
      const internal = yield* TimedMap.make<string, Peer.Reply<Proxy.InternalRequest>>(internalMillis, (_, reply) =>
        runFork(reply.fail(refused(ErrorCode.ServerError, internalTimedOut))), inFlight)
      const handed = decodeHandoff(handedOver)
      if (Option.isSome(handed) && handed.value.role === "extension") {
        for (const { id, reply } of handed.value.internal) internal.set(id, replyTo(reply))
      }
      let timeout: ActorTimer.ActorTimer | undefined

      const announce = () => {
        conn.send(status(true, attached.size))
        for (const [connectionId, client] of attached) {
          peers.tell(conn, client.conn, new Proxy.PeerStatus({ connectionId, peerCount: attached.size }))
        }
      }

      // Adopted from a replica that stopped: the extension authenticated long ago.
      const saved = restored ? yield* recall(conn) : Option.none()
      if (Option.isSome(saved) && saved.value.role === "extension") {
        const { user, extensionId } = saved.value
        const record = yield* extensions.get(Subjects.Key.userExtension(user, extensionId)).pipe(
          orWarn(`could not read extension ${extensionId} of ${user} to adopt its socket`, Option.none())
        )
        if (Option.isSome(record) && record.value.value.conn === conn.id) {
          ext = record.value.value
          yield* seat(extensionSeats, user, scope, true)
          const all = yield* proxies.values().pipe(orWarn(`could not read the proxy connections of adopted extension ${extensionId}`, []))
          for (const { value: p } of all) {
            if (p.extensionConn === conn.id) attached.set(p.connectionId, { conn: Subjects.ConnId(p.clientConn) })
          }
          yield* keepalive(scope, () => conn.send(status(true, attached.size)))
        }
      }
      if (ext === undefined) {
        conn.send(AUTH_REQUEST)
        timeout = yield* ActorTimer.after(config.authTimeout, () => conn.close(CloseCode.PolicyViolation, "Authentication failed: no answer to authenticate"))
      }

      const authenticate = (response: Record<string, unknown>) =>
        Effect.gen(function*() {
          if (!("result" in response)) {
            return conn.close(CloseCode.PolicyViolation, "Authentication failed: authenticate was refused")
          }
          const answer = decodeAuthResult(response["result"])
          const token = Either.isRight(answer) ? tokenOf(answer.right) : undefined
          if (Either.isLeft(answer) || token === undefined) {
            return conn.close(CloseCode.PolicyViolation, "Authentication failed: expected {name, accessToken}")
          }
          const claims = yield* Effect.either(auth.verify(token))
          if (Either.isLeft(claims)) return conn.close(CloseCode.PolicyViolation, `Authentication failed: ${claims.left.reason}`)
          const user = claims.right.sub
          if (!(yield* seat(extensionSeats, user, scope))) {
            yield* Effect.logWarning(`refused an extension of ${user}: it has ${config.maxExtensionsPerUser} on this replica`)
            return conn.close(CloseCode.PolicyViolation, `Too many connections for this user (limit ${config.maxExtensionsPerUser} extensions)`)
          }
          timeout?.cancel()
          const clientId = answer.right.client_id
          const id = clientId === undefined ? `ext-${randomUUID()}` : yield* stableId(user, clientId)
          const key = Subjects.Key.userExtension(user, id)
          // Last one wins: the same browser reconnecting replaces its older socket.
          const previous = yield* extensions.get(key)
          if (Option.isSome(previous) && previous.value.value.conn !== conn.id) {
            const old = previous.value.value
            link.closeAndEnd("router", Subjects.EdgeId(old.edge), Subjects.ConnId(old.conn), CloseCode.Normal, "replaced by a newer connection")
          }
          ext = {
            id,
            name: answer.right.name,
            user,
            conn: conn.id,
            edge: conn.edge,
            connectedAt: Date.now(),
            ...(clientId === undefined ? {} : { clientId })
          }
          yield* extensions.put(key, ext)
          yield* remember(conn, { role: "extension", user, extensionId: id })
          conn.send(notification("authenticated", { user_id: user, extension_id: id }))
          conn.send(status(true, 0))
          yield* keepalive(scope, () => conn.send(status(true, attached.size)))
          yield* Effect.logDebug(`extension ${id} of ${user} authenticated`)
        }).pipe(
          Effect.catchAll((e) =>
            Effect.zipRight(
              Effect.logWarning("router: could not register an extension", e),
              Effect.sync(() => conn.close(CloseCode.InternalError, `could not register the extension: ${e.message}`))
            )
          )
        )

      const stableId = (user: string, clientId: string) =>
        Effect.gen(function*() {
          const key = Subjects.Key.extensionId(user, clientId)
          const fresh = `ext-${randomUUID()}`
          const claimed = yield* Effect.either(extensionIds.create(key, fresh))
          if (Either.isRight(claimed)) return fresh
          const existing = yield* extensionIds.get(key)
          return Option.match(existing, { onNone: () => fresh, onSome: (e) => decoder.decode(e.value) })
        })

      /** Asks the extension on behalf of another service; the answer comes back through `settle`. */
      const askInternal = (request: Proxy.InternalRequest, reply: Peer.Reply<Proxy.InternalRequest>) => {
        if (ext === undefined) return reply.fail(refused(ErrorCode.ServerError, "Not authenticated: the extension has not answered authenticate"))
        // The record the router looked up may be stale: answer only for the extension's own user.
        if (request.user !== ext.user) return reply.fail(refused(ErrorCode.ServerError, "No browser extension is connected for this user"))
        const { method, params } = request
        const id = `${PROXY_ID_PREFIX}${randomUUID()}`
        internal.set(id, reply)
        conn.send(JSON.stringify(params === undefined ? { jsonrpc: "2.0", id, method } : { jsonrpc: "2.0", id, method, params }))
        return Effect.void
      }

      /** The extension's answer to an internal request; late and unknown ones are dropped. */
      const settle = (id: string, response: Record<string, unknown>): Effect.Effect<void> | void => {
        const asked = internal.get(id)
        if (asked === undefined) return
        internal.delete(id)
        if ("result" in response) return asked.succeed(response["result"])
        if (!("error" in response)) return asked.fail(refused(ErrorCode.InternalError, "Internal error: the extension answered with neither result nor error"))
        const error = decodeErrorObject(response["error"])
        return asked.fail(
          Either.isRight(error)
            ? refused(error.right.code, error.right.message)
            : refused(ErrorCode.InternalError, "Internal error: the extension answered with a malformed error")
        )
      }

      const onFrame = (frame: Actors.Frame): Effect.Effect<void> | void => {
        const parsed = parse(frame.text)
        if (Either.isLeft(parsed)) return conn.send(failure(null, ErrorCode.ParseError, `Parse error: ${parsed.left}`))
        const message = parsed.right
        if (!isRecord(message)) return conn.send(failure(null, ErrorCode.InvalidRequest, "Invalid Request: expected a JSON object"))
        const id = message["id"]
        if ("method" in message) {
          // The extension is passive; it has nothing to ask of the proxy.
          if (id === undefined) return
          const request = JsonRpc.decodeValue(message)
          // Not a valid request (a method that is no string, say): the decoder's -32600 says why.
          if (Either.isLeft(request)) return conn.send(JsonRpc.encode(request.left))
          if (request.right._tag !== "Request") return
          const { id: asked, method } = request.right.message
          return conn.send(failure(asked, ErrorCode.MethodNotFound, `Method not found: ${method}`))
        }
        if (id === AUTH_REQUEST_ID) return ext === undefined ? authenticate(message) : undefined
        if (ext === undefined) return conn.send(failure(null, ErrorCode.ServerError, "Not authenticated: answer the authenticate request first"))
        if (typeof id !== "string") {
          return conn.send(failure(null, ErrorCode.InvalidRequest, "Invalid Request: a response to a forwarded request carries its mapped string id"))
        }
        if (id.startsWith(PROXY_ID_PREFIX)) return settle(id, message)
        const colon = id.indexOf(":")
        const connectionId = colon < 0 ? id : id.slice(0, colon)
        const client = attached.get(connectionId)
        if (client !== undefined) return peers.tell(conn, client.conn, { _tag: "Answer", response: message })
        const self = ext
        const who = `extension ${self.id} of ${self.user} (conn ${conn.id})`
        if (!CONNECTION_ID.test(connectionId)) return Effect.logWarning(`router: dropped a reply from ${who} to ${shown(id)}: no connection has that id`)
        // Attached through another replica's view, or a late answer after a disconnect. Anyone can
        // write a connection id, so the record must name this very socket and user: otherwise
        // another extension could answer a request that was never sent to it.
        return proxies.get(Subjects.Key.proxyConnection(connectionId)).pipe(
          Effect.flatMap(Option.match({
            onNone: () => Effect.void,
            onSome: ({ value: p }) =>
              p.extensionConn === conn.id && p.user === self.user
                ? Effect.sync(() => peers.tell(conn, Subjects.ConnId(p.clientConn), { _tag: "Answer", response: message }))
                : Effect.logWarning(
                  `router: dropped a reply from ${who} to ${shown(id)}: ${connectionId} is the connection of ${p.user}'s client (conn ${p.clientConn}) ` +
                    `to extension ${p.extensionId} (conn ${p.extensionConn})`
                )
          })),
          warnIfFails(`could not look up ${connectionId} for a reply from ${who}`)
        )
      }

      const receive = (message: Proxy.RouterPeer, reply: Peer.ReplyTo): Effect.Effect<void> | void => {
        switch (message._tag) {
          case "Attach": {
            if (ext === undefined || message.user !== ext.user) {
              return reply(message).fail(new Proxy.AttachRefused({ reason: "Extension not found or not accessible" }))
            }
            attached.set(message.connectionId, { conn: Subjects.ConnId(message.clientConn) })
            const answered = reply(message).succeed({ name: ext.name, peerCount: attached.size })
            return Effect.zipRight(answered, Effect.sync(announce))
          }
          case "Detach":
            if (attached.delete(message.connectionId)) announce()
            return
          case "InternalRequest":
            return askInternal(message, reply(message))
        }
      }

      const onClosed = (code: number, reason: string) =>
        Effect.gen(function*() {
          // A close the edge or the router made for a reason (a frame too large, a policy) says so,
          // since the client otherwise only learns that its extension is gone.
          const why = code === CloseCode.Normal && reason.startsWith("replaced")
            ? "Extension reconnected"
            : GIVEN_REASONS.has(code) && reason !== ""
            ? `Extension closed: ${reason}`
            : "Extension closed"
          const unanswered = [...internal.values()]
          internal.clear()
          yield* Effect.forEach(unanswered, (reply) => reply.fail(refused(ErrorCode.ServerError, "Extension disconnected")), { discard: true })
          for (const [connectionId, client] of attached) {
            peers.tell(conn, client.conn, new Proxy.ExtensionGone({ connectionId, reason: why }))
          }
          attached.clear()
          yield* forget(conn)
          if (ext === undefined) return
          const key = Subjects.Key.userExtension(ext.user, ext.id)
          const current = yield* extensions.get(key)
          // A newer socket of the same browser may already own the record.
          if (Option.isSome(current) && current.value.value.conn === conn.id) yield* extensions.delete(key)
        }).pipe(warnIfFails("could not remove a closed extension's record; it stays listed until it is replaced"))

      const onHandoff = (): Proxy.HandoffState => ({
        role: "extension",
        // An asker on this replica cannot follow the request to another; it times out instead.
        internal: [...internal.entries()].flatMap(([id, r]) => (r.subject === undefined ? [] : [{ id, reply: r.subject }]))
      })

      return { onFrame, receive, onClosed, onHandoff } satisfies Actors.Actor<never, Proxy.RouterPeer>
    })

  // --- the MCP client's actor --------------------------------------------------------------

  interface Pending {
    readonly id: JsonRpc.Id
    readonly method: string
    readonly span: Tracer.AnySpan | undefined
  }

  const clientActor = (conn: Actors.Connection, restored: boolean, handedOver: unknown) =>
    Effect.gen(function*() {
      const scope = yield* Effect.scope
      let user: string | undefined
      let session:
        | {
          readonly connectionId: string
          readonly extensionId: string
          readonly extConn: Subjects.ConnId
          /** The extension's socket, for forwarding. */
          readonly extension: Actors.Socket
          peerCount: number
        }
        | undefined
      // Adopted from a replica that stopped: requests in flight there are lost (the client times
      // them out), but the handshake and the connection to the extension carry on.
      const saved = restored ? yield* recall(conn) : Option.none()
      if (Option.isSome(saved) && saved.value.role === "client") {
        user = saved.value.user
        yield* seat(clientSeats, user, scope, true)
        const connectionId = saved.value.connectionId
        if (connectionId !== undefined) {
          const p = yield* proxies.get(Subjects.Key.proxyConnection(connectionId)).pipe(
            orWarn(`could not read ${connectionId} of an adopted client; it carries on unconnected`, Option.none())
          )
          if (Option.isSome(p)) {
            const v = p.value.value
            session = {
              connectionId,
              extensionId: v.extensionId,
              extConn: Subjects.ConnId(v.extensionConn),
              extension: link.to(Subjects.EdgeId(v.extensionEdge), Subjects.ConnId(v.extensionConn)),
              peerCount: 1
            }
          }
        }
      }
      // An anonymous socket would hold its place forever: as on /extension, authenticating has a
      // deadline. Failed attempts don't extend it; an adopted socket that had authenticated has none.
      const deadline = user !== undefined
        ? undefined
        : yield* ActorTimer.after(config.authTimeout, () => conn.close(CloseCode.PolicyViolation, "Authentication failed: no mcp_handshake in time"))
      const pending = yield* TimedMap.make<string, Pending>(timeoutMillis, (_, p) => send(failure(p.id, ErrorCode.ServerError, timedOut)), inFlight)
      // Requests in flight at the replica that handed this socket over: their answers come here.
      const handed = decodeHandoff(handedOver)
      if (Option.isSome(handed) && handed.value.role === "client") {
        for (const { id, mapped, method } of handed.value.pending) pending.set(mapped, { id, method, span: undefined })
      }
      const budget = new RateBudget(config.connectionRate, config.connectionRate * 2)

      const send = (data: string, span?: Tracer.AnySpan) =>
        conn.send(data, span === undefined ? undefined : Telemetry.traceHeaders(span).traceparent)

      /** Fails everything in flight at once, as when the extension goes away. */
      const failPending = (message: string) => {
        for (const p of pending.values()) send(failure(p.id, ErrorCode.ServerError, message))
        pending.clear()
      }

      const endSession = (reason: string, notify: boolean) => {
        if (session === undefined) return
        const ended = session
        session = undefined
        failPending(`Extension disconnected: ${reason}`)
        if (notify) send(notification("disconnected", { connection_id: ended.connectionId, reason }))
        send(status(false, 0))
        return ended
      }

      const handshake = (request: JsonRpc.Request) =>
        Effect.gen(function*() {
          // A socket is one user's for its whole life: a second token must not switch it to another.
          if (user !== undefined) return send(failure(request.id, ErrorCode.ServerError1, "MCP client already authenticated"))
          const params = decodeHandshake(request.params ?? {})
          const token = Either.isRight(params) ? tokenOf(params.right) : undefined
          if (token === undefined) return send(failure(request.id, ErrorCode.ServerError, "Authentication failed: accessToken is required"))
          const claims = yield* Effect.either(auth.verify(token))
          if (Either.isLeft(claims)) return send(failure(request.id, ErrorCode.ServerError, `Authentication failed: ${claims.left.reason}`))
          const who = claims.right.sub
          if (!(yield* seat(clientSeats, who, scope))) {
            yield* Effect.logWarning(`refused an MCP client of ${who}: it has ${config.maxClientsPerUser} on this replica`)
            return send(failure(request.id, ErrorCode.ServerError, `Too many connections for this user (limit ${config.maxClientsPerUser} MCP clients)`))
          }
          deadline?.cancel()
          user = who
          yield* remember(conn, { role: "client", user })
          send(result(request.id, { authenticated: true, user_id: user, mcp_client_id: `mcp-${randomUUID()}` }))
        })

      const listExtensions = (request: JsonRpc.Request, owner: string) =>
        extensions.values(Subjects.Key.userExtensions(owner)).pipe(
          Effect.map((found) => send(result(request.id, { extensions: found.map(({ value }) => ({ id: value.id, name: value.name, connected: true })) }))),
          Effect.catchAll((e) =>
            Effect.zipRight(
              Effect.logWarning(`router: could not list the extensions of ${owner}`, e),
              Effect.sync(() => send(failure(request.id, ErrorCode.InternalError, "Internal error: could not list extensions")))
            )
          )
        )

      const connect = (request: JsonRpc.Request, owner: string) =>
        Effect.gen(function*() {
          if (session !== undefined) return send(failure(request.id, ErrorCode.ServerError1, "MCP client already connected to an extension"))
          const params = decodeConnect(request.params ?? {})
          if (Either.isLeft(params)) return send(failure(request.id, ErrorCode.InvalidParams, "Invalid params: extension_id (string) is required"))
          const notFound = () => send(failure(request.id, ErrorCode.ServerError, "Extension not found or not accessible"))
          const extensionId = params.right.extension_id
          const record = yield* extensions.get(Subjects.Key.userExtension(owner, extensionId)).pipe(
            orWarn(`could not read extension ${extensionId} of ${owner} to connect to it`, Option.none())
          )
          if (Option.isNone(record)) return notFound()
          const ext = record.value.value
          const connectionId = `conn-${randomUUID()}`
          const answer = yield* peers
            .ask(conn, Subjects.ConnId(ext.conn), new Proxy.Attach({ connectionId, user: owner, clientConn: conn.id }), { timeout: "5 seconds" })
            .pipe(Effect.either)
          // Nobody listens: a record a crash left behind, which is as good as not found. A refusal
          // is not found either. Anything else means a live extension's actor could not be
          // reached, which is worth knowing.
          if (Either.isLeft(answer)) {
            const why = answer.left
            if (why._tag !== "AttachRefused" && !(why._tag === "PeerUnavailable" && why.reason === "NoResponders")) {
              yield* Effect.logWarning(`router: extension ${extensionId} of ${owner} did not answer attach`, why)
            }
            return notFound()
          }
          const attached = answer.right
          session = {
            connectionId,
            extensionId,
            extConn: Subjects.ConnId(ext.conn),
            extension: link.to(Subjects.EdgeId(ext.edge), Subjects.ConnId(ext.conn)),
            peerCount: attached.peerCount
          }
          yield* proxies
            .put(Subjects.Key.proxyConnection(connectionId), {
              connectionId,
              user: owner,
              extensionId,
              extensionConn: ext.conn,
              extensionEdge: ext.edge,
              clientConn: conn.id
            })
            .pipe(warnIfFails(`could not record ${connectionId}; a replica that adopts either socket will not know it`))
          yield* remember(conn, { role: "client", user: owner, connectionId })
          send(result(request.id, { connection_id: connectionId, extension_id: extensionId, extension_name: attached.name }))
        })

      const disconnect = (request: JsonRpc.Request) =>
        Effect.gen(function*() {
          const ended = endSession("Client disconnected", false)
          if (ended !== undefined) {
            yield* detach(ended.connectionId, ended.extConn)
            if (user !== undefined) yield* remember(conn, { role: "client", user })
          }
          send(result(request.id, { disconnected: true }))
        })

      const detach = (connectionId: string, extConn: Subjects.ConnId) =>
        Effect.suspend(() => {
          peers.tell(conn, extConn, new Proxy.Detach({ connectionId }))
          return proxies.delete(Subjects.Key.proxyConnection(connectionId)).pipe(warnIfFails(`could not remove the record of ${connectionId}`))
        })

      /** Maps the id and sends the request to the extension; synchronous, once per forwarded request. */
      const forward = (request: JsonRpc.Request, owner: string, span?: Tracer.Span): void => {
        if (session === undefined) return send(failure(request.id, ErrorCode.ServerError, "Not connected to an extension"))
        if (budget.take() !== "ok" || userBudget(owner).take() !== "ok") {
          return send(failure(request.id, ErrorCode.ServerError, "Rate limit exceeded"))
        }
        if (pending.size >= config.maxPending) {
          return send(failure(request.id, ErrorCode.ServerError, `Too many pending requests (limit ${config.maxPending})`))
        }
        const mapped = `${session.connectionId}:${String(request.id)}`
        if (pending.has(mapped)) return send(failure(request.id, ErrorCode.InvalidRequest, `Invalid Request: id ${String(request.id)} is already in flight`))
        if (span !== undefined) span.attribute("mcp.mapped_id", mapped)
        pending.set(mapped, { id: request.id, method: request.method, span })
        session.extension.send(JSON.stringify(relayed(request, mapped)), span && Telemetry.traceHeaders(span).traceparent)
      }

      const onRequest = (request: JsonRpc.Request, frame: Actors.Frame): Effect.Effect<void> | void => {
        if (isReserved(request.id)) {
          return send(failure(request.id, ErrorCode.InvalidRequest, `Invalid Request: ids starting with "proxy:" or "ext:" are reserved`))
        }
        if (frame.limited) return send(failure(request.id, ErrorCode.ServerError, "Rate limit exceeded"))
        if (request.method === "mcp_handshake") return handshake(request)
        const owner = user
        if (owner === undefined) return send(failure(request.id, ErrorCode.ServerError, "Not authenticated: send mcp_handshake first"))
        switch (request.method) {
          case "list_extensions":
            return listExtensions(request, owner)
          case "connect":
            return connect(request, owner)
          case "disconnect":
            return disconnect(request)
        }
        if (!traced) return forward(request, owner)
        return Effect.currentSpan.pipe(
          Effect.map((span) => forward(request, owner, span)),
          Effect.withSpan(`router.forward ${request.method}`, {
            kind: "server",
            attributes: {
              "rpc.method": request.method,
              "mcp.request.id": String(request.id),
              "sb.conn": conn.id,
              "user_id": owner,
              ...(session === undefined ? {} : { connection_id: session.connectionId })
            }
          }),
          Telemetry.withRemoteParent(frame.traceparent),
          Effect.ignore
        )
      }

      const onFrame = (frame: Actors.Frame): Effect.Effect<void> | void => {
        const decoded = JsonRpc.decodeFrame(frame.text)
        if (Either.isLeft(decoded)) return send(JsonRpc.encode(decoded.left))
        const incoming = decoded.right
        if (incoming._tag === "Request") return onRequest(incoming.message, frame)
        if (incoming._tag === "Notification" && session !== undefined && user !== undefined) {
          session.extension.send(JSON.stringify(relayed(incoming.message)))
        }
        // A client answers nothing; its stray responses and notifications before connect go nowhere.
      }

      /** The extension's answer, as the extension's actor passed it on. */
      const onAnswer = ({ response }: Proxy.Answer): Effect.Effect<void> | void => {
        const mapped = response["id"]
        if (typeof mapped !== "string") return
        const p = pending.get(mapped)
        if (p === undefined) return // late: timed out, or the client disconnected since
        pending.delete(mapped)
        const answer = "result" in response || "error" in response
          ? JSON.stringify(relayed(response, p.id))
          : failure(p.id, ErrorCode.InternalError, "Internal error: the extension answered with neither result nor error")
        if (p.span === undefined) return send(answer)
        return Effect.currentSpan.pipe(
          Effect.map((span) => send(answer, span)),
          Effect.withSpan(`router.reply ${p.method}`, {
            kind: "server",
            parent: p.span,
            attributes: {
              "rpc.method": p.method,
              "mcp.request.id": String(p.id),
              "mcp.mapped_id": mapped,
              "sb.conn": conn.id,
              "connection_id": mapped.slice(0, mapped.indexOf(":")),
              "user_id": user ?? ""
            }
          }),
          Effect.ignore
        )
      }

      const receive = (message: Proxy.RouterPeer): Effect.Effect<void> | void => {
        switch (message._tag) {
          case "Answer":
            return onAnswer(message)
          case "ExtensionGone":
            if (session?.connectionId !== message.connectionId) return
            endSession(message.reason, true)
            if (user !== undefined) return remember(conn, { role: "client", user })
            return
          case "PeerStatus":
            if (session?.connectionId !== message.connectionId) return
            session.peerCount = message.peerCount
            return send(status(true, session.peerCount))
        }
      }

      const onClosed = () =>
        Effect.suspend(() => {
          pending.clear()
          const ended = session
          session = undefined
          return Effect.zipRight(ended === undefined ? Effect.void : detach(ended.connectionId, ended.extConn), forget(conn))
        })

      const onHandoff = (): Proxy.HandoffState => ({
        role: "client",
        pending: [...pending.entries()].map(([mapped, p]) => ({ mapped, id: p.id, method: p.method }))
      })

      yield* keepalive(yield* Effect.scope, () => send(status(session !== undefined, session?.peerCount ?? 0)))
      return { onFrame, receive, onClosed, onHandoff } satisfies Actors.Actor<never, Proxy.RouterPeer>
    })

  // --- the internal client: other services' requests to a user's extension -----------------

  /** Internal requests go over the bus even to an actor of this replica: their reply subject survives a hand-off. */
  const outside = Peer.outside(bus, "router")

  /** One extension's actor asked; none when its session is gone (a record a crash left behind). */
  const askExtension = (ext: Proxy.ExtensionRecord, request: Proxy.InternalRequest) =>
    peers.ask(outside, Subjects.ConnId(ext.conn), request, {
      // The actor times the extension out itself; this only catches an actor that is gone.
      timeout: Duration.sum(config.internalTimeout, Duration.seconds(1))
    }).pipe(
      Effect.map(Option.some),
      Effect.catchTags({
        PeerUnavailable: (e) =>
          e.reason === "NoResponders"
            ? Effect.succeed(Option.none())
            : Effect.fail(
              e.reason === "Malformed"
                ? refused(ErrorCode.InternalError, "Internal error: malformed reply from the extension's session")
                : refused(ErrorCode.ServerError, `The extension did not answer: ${e.message}`)
            ),
        PeerTimeout: (e) => Effect.fail(refused(ErrorCode.ServerError, `The extension did not answer: no reply within ${Duration.format(e.timeout)}`))
      })
    )

  /** The user's most recently connected extension answers, or the next one if its session is gone. */
  const internalRequest = (request: Proxy.InternalRequest) =>
    Effect.gen(function*() {
      const found = yield* Effect.either(extensions.values(Subjects.Key.userExtensions(request.user)))
      if (Either.isLeft(found)) {
        yield* Effect.logWarning(`router: could not look up the extensions of ${request.user} for an internal request`, found.left)
        return yield* refused(ErrorCode.InternalError, "Internal error: could not look up the user's extensions")
      }
      const newestFirst = found.right.map(({ value }) => value).sort((a, b) => b.connectedAt - a.connectedAt)
      for (const ext of newestFirst) {
        const answer = yield* askExtension(ext, request)
        if (Option.isSome(answer)) return answer.value
      }
      return yield* refused(ErrorCode.ServerError, "No browser extension is connected for this user")
    })

  yield* peers.serve(
    Subjects.routerInternal,
    (message, reply) => {
      if (message._tag !== "InternalRequest") return Effect.logWarning(`router: ignored a ${message._tag} on ${Subjects.routerInternal}`)
      return Effect.flatMap(Effect.exit(internalRequest(message)), reply(message).complete)
    },
    { queue: Subjects.Queue.service("router") }
  )

  yield* Actors.host({
    service: "router",
    protocol: peers,
    replicaHeartbeat: config.replicaHeartbeat,
    shutdownGrace: config.shutdownGrace,
    make: (conn, restored, handedOver) =>
      conn.open.path === "/extension" ? extensionActor(conn, restored, handedOver) : clientActor(conn, restored, handedOver)
  })
})

export const layer = Layer.scopedDiscard(make)
