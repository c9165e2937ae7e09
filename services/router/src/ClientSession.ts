/**
 * The actor of an MCP client's socket (`/mcp`, the active role): `mcp_handshake`, then
 * `list_extensions`, `connect` and `disconnect`, answered by the proxy itself; every other request
 * goes to the connected extension under the id `<connection_id>:<id>`. The actor owns its pending
 * requests: the extension's actor (`ExtensionSession.ts`) passes each answer back as a peer message.
 */
import { type Actors, ActorTimer, type Peer, RateBudget, Subjects, TimedMap } from "@switchboard/bus"
import { Edge, JsonRpc, Proxy } from "@switchboard/protocol"
import { Telemetry } from "@switchboard/telemetry"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import type * as Tracer from "effect/Tracer"
import { randomUUID } from "node:crypto"
import { failure, notification, orWarn, relayed, result, status, warnIfFails } from "./Replies.ts"
import { askAttached, decodeHandoff, peers, type ProbeOutcome, type Replica } from "./Replica.ts"

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

export const make = (replica: Replica) => {
  // Taken apart once per replica, not per actor: an idle actor's closure holds no copies of these.
  const { auth, clientSeats, config, extensions, forget, inFlight, keepalive, link, probes, proxies, recall, remember, runFork, seat, timedOut, timeoutMillis, traced, userBudget } = replica
  return (conn: Actors.Connection, restored: boolean, handedOver: unknown) =>
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
      const pending = yield* TimedMap.make<string, Pending>(timeoutMillis, (_, p) => {
        send(failure(p.id, ErrorCode.ServerError, timedOut))
        probeAfterTimeout()
      }, inFlight)
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
        probes.delete(conn.id)
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
          // The spec answers every failed handshake with -32000, a missing or ill-typed token too.
          if (Either.isLeft(params)) return send(failure(request.id, ErrorCode.ServerError, `Authentication failed: ${JsonRpc.shapeIssue(params.left)}`))
          const claims = yield* Effect.either(auth.verify(params.right.token))
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
          yield* track
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

      /** Whether a probe is in flight, and until when a timed-out request starts none. */
      let probing = false
      let quietUntil = 0
      /** Whether the actor's scope already removes its entry from `probes`. */
      let tracked = false

      /**
       * Asks the extension's actor whether this session is still attached to it, in a fiber of its
       * own: the mailbox goes on meanwhile. If it is gone, the session ends through the mailbox, as
       * the `ExtensionGone` that was lost would have ended it, and only if it is the same session
       * by then. No answer in time proves nothing (NATS may be slow): the session carries on.
       */
      const probe = (): Effect.Effect<ProbeOutcome> =>
        Effect.suspend(() => {
          const s = session
          if (s === undefined) return Effect.succeed<ProbeOutcome>("attached")
          probing = true
          const { connectionId, extConn } = s
          // `user` is set before any session is.
          const record = user === undefined ? Effect.fail("no user") : extensions.get(Subjects.Key.userExtension(user, s.extensionId))
          return askAttached(conn, extConn, connectionId, config.probeTimeout, record, (ext) => ext.conn === extConn).pipe(
            Effect.tap((outcome) => {
              if (outcome === "gone") peers.tell(conn, conn.id, new Proxy.ExtensionGone({ connectionId, reason: GONE }))
              return Effect.logDebug(`router: probed extension conn ${extConn} for ${connectionId}: ${outcome}`)
            }),
            Effect.ensuring(Effect.sync(() => void (probing = false)))
          )
        })

      /**
       * A forwarded request timed out, perhaps because the extension's actor is gone: one probe for
       * a burst of timeouts, and none again for a timeout period after it.
       */
      const probeAfterTimeout = () => {
        if (session === undefined || probing || Date.now() < quietUntil) return
        quietUntil = Date.now() + timeoutMillis
        runFork(probe())
      }

      /** Enters the session in the replica's `probes`, which it checks when its NATS connection comes back. */
      const track = Effect.suspend(() => {
        probes.set(conn.id, probe)
        if (tracked) return Effect.void
        tracked = true
        // Handed over, or stopped with its replica, the actor ends without `onClosed`: its scope removes the entry.
        return Scope.addFinalizer(scope, Effect.sync(() => void probes.delete(conn.id)))
      })
      if (session !== undefined) yield* track

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

      const receive = (message: Proxy.RouterPeer, reply: Peer.ReplyTo): Effect.Effect<void> | void => {
        switch (message._tag) {
          case "Probe":
            // The extension's actor, back on NATS, checks that its client did not leave unheard.
            return reply(message).succeed({ attached: session?.connectionId === message.connectionId })
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
          probes.delete(conn.id)
          return Effect.zipRight(ended === undefined ? Effect.void : detach(ended.connectionId, ended.extConn), forget(conn))
        })

      const onHandoff = (): Proxy.HandoffState => ({
        role: "client",
        pending: [...pending.entries()].map(([mapped, p]) => ({ mapped, id: p.id, method: p.method }))
      })

      yield* keepalive(yield* Effect.scope, () => send(status(session !== undefined, session?.peerCount ?? 0)))
      return { onFrame, receive, onClosed, onHandoff } satisfies Actors.Actor<never, Proxy.RouterPeer>
    })
}
