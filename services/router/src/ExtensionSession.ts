/**
 * The actor of a browser extension's socket (`/extension`, the passive role): the proxy asks it to
 * `authenticate`, lists it under its user in KV, and passes its answers on to the client actors
 * attached to it (`ClientSession.ts`) as peer messages. Other services' requests reach it through
 * `InternalRequests.ts`; it asks the extension as the proxy itself, with `proxy:` ids.
 */
import { type Actors, ActorTimer, type Peer, Subjects, TimedMap } from "@switchboard/bus"
import { Edge, Json, JsonRpc, Proxy } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import { failure, notification, orWarn, refused, status, warnIfFails } from "./Replies.ts"
import { askAttached, decodeHandoff, peers, type ProbeOutcome, type Replica } from "./Replica.ts"

const { ErrorCode } = JsonRpc
const CloseCode = Edge.CloseCode
const decoder = new TextDecoder()
const isRecord = JsonRpc.isRecord
const decodeErrorObject = Schema.decodeUnknownEither(JsonRpc.ErrorObject)
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

export const make = (replica: Replica) => {
  // Taken apart once per replica, not per actor: an idle actor's closure holds no copies of these.
  const { auth, config, extensionIds, extensions, extensionSeats, forget, inFlight, internalMillis, internalTimedOut, keepalive, link, probes, proxies, recall, remember, runFork, seat } = replica

  /** Where an internal request's answer goes, for one handed over from another replica. */
  const replyTo = (subject: string) => peers.replyAt(replica.bus, Proxy.InternalRequest, subject)
  return (conn: Actors.Connection, restored: boolean, handedOver: unknown) =>
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
          if (Either.isLeft(answer)) {
            return conn.close(CloseCode.PolicyViolation, `Authentication failed: expected {name, accessToken} (${JsonRpc.shapeIssue(answer.left)})`)
          }
          const claims = yield* Effect.either(auth.verify(answer.right.token))
          if (Either.isLeft(claims)) return conn.close(CloseCode.PolicyViolation, `Authentication failed: ${claims.left.reason}`)
          const user = claims.right.sub
          if (!(yield* seat(extensionSeats, user, scope))) {
            yield* Effect.logWarning(`refused an extension of ${user}: it has ${config.maxExtensionsPerUser} on this replica`)
            return conn.close(CloseCode.PolicyViolation, `Too many connections for this user (limit ${config.maxExtensionsPerUser} extensions)`)
          }
          timeout?.cancel()
          const clientId = answer.right.clientId
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
        const parsed = Json.parse(frame.text)
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

      /**
       * After this replica's NATS connection came back: a client's `Detach` may have been lost
       * meanwhile, leaving a client here that is gone (a wrong `peer_count`, answers sent to
       * nobody). Each attached client's actor is asked, as it asks this one; one that says no, or
       * a connection nobody listens on whose record is gone too, is detached through this actor's
       * own mailbox, as a `Detach` would be. One client at a time: the replica bounds how many
       * actors check at once.
       */
      const recheck = (): Effect.Effect<ProbeOutcome> =>
        Effect.forEach([...attached], ([connectionId, client]) =>
          askAttached(conn, client.conn, connectionId, config.probeTimeout, proxies.get(Subjects.Key.proxyConnection(connectionId)), (p) => p.extensionConn === conn.id).pipe(
            Effect.tap((outcome) => (outcome === "gone" ? Effect.sync(() => peers.tell(conn, conn.id, new Proxy.Detach({ connectionId }))) : Effect.void))
          )).pipe(
            Effect.map((outcomes): ProbeOutcome => (outcomes.includes("gone") ? "gone" : outcomes.includes("unknown") ? "unknown" : "attached")),
            Effect.tap((outcome) => Effect.logDebug(`router: rechecked the clients of extension conn ${conn.id}: ${outcome}`))
          )

      /** Whether the actor's scope already removes its entry from `probes`. */
      let tracked = false
      /** Enters the extension in the replica's `probes` once a client attaches; the actor's scope takes it out. */
      const track = Effect.suspend(() => {
        if (tracked) return Effect.void
        tracked = true
        probes.set(conn.id, recheck)
        return Scope.addFinalizer(scope, Effect.sync(() => void probes.delete(conn.id)))
      })
      if (attached.size > 0) yield* track

      const receive = (message: Proxy.RouterPeer, reply: Peer.ReplyTo): Effect.Effect<void> | void => {
        switch (message._tag) {
          case "Attach": {
            if (ext === undefined || message.user !== ext.user) {
              return reply(message).fail(new Proxy.AttachRefused({ reason: "Extension not found or not accessible" }))
            }
            attached.set(message.connectionId, { conn: Subjects.ConnId(message.clientConn) })
            const answered = reply(message).succeed({ name: ext.name, peerCount: attached.size })
            return Effect.zipRight(answered, Effect.zipRight(track, Effect.sync(announce)))
          }
          case "Probe":
            // A client that asks may have missed our `ExtensionGone`, or we its `Detach`; either
            // way only what this actor holds now counts.
            return reply(message).succeed({ attached: ext !== undefined && attached.has(message.connectionId) })
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
}
