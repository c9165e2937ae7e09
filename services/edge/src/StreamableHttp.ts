/**
 * Streamable HTTP's sessions (MCP 2025-03-26 to 2025-11-25) at the hub's path: the same registry
 * session a WebSocket `/hub` gets, over plain HTTP. `initialize` opens the session's actor as a
 * socket's is opened, each message goes to it over the bus, and its answers come back to an
 * exchange (`HttpExchanges`). A session id is its actor's connection id, so any edge serves any
 * session. The checks every request passes are `HttpChecks`; the OAuth document, `ResourceMetadata`.
 * A POST of the modern era (MCP 2026-07-28, no session) goes to `ModernHttp` instead.
 */
import { AuthClient } from "@switchboard/auth"
import * as AuthConfig from "@switchboard/auth/Config"
import { Actors, Bus, Kv, Subjects } from "@switchboard/bus"
import { type Auth, Edge as EdgeProtocol, Envelope, JsonRpc } from "@switchboard/protocol"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import type * as ConfigError from "effect/ConfigError"
import type * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import type * as Http from "node:http"
import * as EdgeConfig from "./Config.ts"
import * as Checks from "./HttpChecks.ts"
import { fail, refuse } from "./HttpChecks.ts"
import * as HttpExchanges from "./HttpExchanges.ts"
import * as ModernHttp from "./ModernHttp.ts"
import * as ModernRequest from "./ModernRequest.ts"
import type { EdgeMetrics } from "./Metrics.ts"
import type { OriginPolicy } from "./OriginPolicy.ts"
import { loggable } from "./Requests.ts"
import * as ResourceMetadata from "./ResourceMetadata.ts"
import { type Span, SpanKind } from "@opentelemetry/api"
import { Telemetry } from "@switchboard/telemetry"

export interface StreamableHttpShape {
  /** Whether a plain HTTP request at this path is answered here. */
  readonly serves: (path: string) => boolean
  readonly handle: (req: Http.IncomingMessage, res: Http.ServerResponse, url: URL) => void
  /** A delivery to one of this edge's exchanges. */
  readonly deliver: (delivery: Envelope.Exchange, data: Uint8Array) => void
  /** Ends every open GET stream, so that its client resumes from its `Last-Event-ID`; the number ended. */
  readonly endStreams: () => number
}

export interface StreamableHttpOptions {
  readonly edgeId: Subjects.EdgeId
  /** The hub's path and the service that hosts its sessions. */
  readonly path: string
  readonly service: Subjects.ServiceName
  /** Which Origins may reach sessions (the HTTP routes have checked `Host` already). */
  readonly policy: OriginPolicy
  /** The longest bearer token taken; a longer one is refused 401 without being verified. */
  readonly maxTokenBytes: number
  readonly openTimeout: Duration.DurationInput
  readonly runFork: <A, E>(effect: Effect.Effect<A, E>) => unknown
  readonly logCaught: (what: string, cause: unknown, about: Readonly<Record<string, string>>) => void
  /**
   * Counts a message read in this turn, as a socket's frame is: many requests in one turn are a
   * burst, and the edge then writes what they cause (calls to a tab's socket) in one write.
   */
  readonly countFrame: () => void
  /** Counts the responses cut because their client stopped reading. */
  readonly metrics: EdgeMetrics
}

const HTTP_SPAN = { "sb.transport": "http" } as const

const SESSION = "mcp-session-id"

export const make = (
  options: StreamableHttpOptions
): Effect.Effect<StreamableHttpShape, Bus.BusError | ConfigError.ConfigError, Bus.Bus | Kv.Kv | AuthClient.AuthClient | Telemetry.Tracing | Scope.Scope> =>
  Effect.gen(function*() {
    const { tracer } = yield* Telemetry.Tracing
    const bus = yield* Bus.Bus
    const auth = yield* AuthClient.AuthClient
    const connections = Actors.connectionRecords(yield* (yield* Kv.Kv).bucket(Subjects.Bucket.connections))
    const config = {
      maxBody: yield* EdgeConfig.httpMaxBody,
      keepAlive: yield* EdgeConfig.httpKeepAlive,
      sessionCache: Duration.toMillis(yield* EdgeConfig.httpSessionCache)
    }
    const { edgeId, runFork } = options
    const metadata = ResourceMetadata.make({ policy: options.policy, resource: options.path, issuer: yield* AuthConfig.issuer })
    const exchanges = yield* HttpExchanges.make({ edgeId, metrics: options.metrics, runFork, logCaught: options.logCaught })
    const modern = ModernHttp.make({ edgeId, path: options.path, bus, exchanges, tracer, runFork, countFrame: options.countFrame })
    /** Sessions found in KV, with their user, trusted for a moment; and sessions deleted here, never trusted again. */
    const known = new Map<Subjects.ConnId, { readonly user: string | undefined; readonly until: number }>()
    const gone = new Map<Subjects.ConnId, number>()

    const forget = setInterval(() => {
      const now = Date.now()
      for (const [id, entry] of known) if (entry.until <= now) known.delete(id)
      for (const [id, until] of gone) if (until <= now) gone.delete(id)
    }, Duration.toMillis(config.keepAlive))
    forget.unref()
    yield* Effect.addFinalizer(() => Effect.sync(() => clearInterval(forget)))

    const unauthorized = (req: Http.IncomingMessage, res: Http.ServerResponse, why: string, invalid: boolean) =>
      Checks.unauthorized(res, metadata.url(req), why, invalid)

    // --- sessions ----------------------------------------------------------------------------

    /** Whether `raw` names a live session of `user`: a session of another user is as unknown as none. */
    const sessionOf = (raw: string, user: string, then: (session: Subjects.ConnId | undefined) => void, unavailable: () => void) => {
      if (!Subjects.isConnId(raw) || gone.has(raw)) return then(undefined)
      const cached = known.get(raw)
      if (cached !== undefined && cached.until > Date.now()) return then(cached.user === user ? raw : undefined)
      runFork(
        connections.get(Subjects.Key.connection(raw)).pipe(
          Effect.match({
            onFailure: unavailable,
            onSuccess: (found) => {
              const record = Option.getOrUndefined(found)?.value
              if (record === undefined || record.service !== options.service || record.open.transport !== "http") return then(undefined)
              const owner = record.open.claims?.sub
              if (known.size > 100_000) known.clear()
              known.set(raw, { user: owner, until: Date.now() + config.sessionCache })
              then(owner === user ? raw : undefined)
            }
          })
        )
      )
    }

    /** A session's frame, or its exchange's control (`httpOp`), as the envelope carries it. */
    const frameHeaders = (session: Subjects.ConnId, user: string, extra: Partial<Pick<Envelope.Frame, "traceparent" | "http" | "httpOp" | "lastEventId">>): Envelope.Headers =>
      Envelope.encodeEdgeIn({
        _tag: "Frame",
        conn: session,
        edge: edgeId,
        user,
        limited: false,
        traceparent: extra.traceparent,
        http: extra.http,
        httpOp: extra.httpOp,
        lastEventId: extra.lastEventId
      })

    /**
     * The edge's span for a message it hands to a session, as a socket's frame gets one; a host
     * that sent a W3C `traceparent` sees it continue its own trace.
     */
    const receiveSpan = (res: Http.ServerResponse, session: Subjects.ConnId): { readonly span: Span; readonly traceparent: string } | undefined => {
      if (Option.isNone(tracer)) return undefined
      const parent = res.req.headers.traceparent
      return Telemetry.startSpan(tracer.value, "edge.receive", typeof parent === "string" ? parent : undefined, {
        kind: SpanKind.CONSUMER,
        attributes: { ...HTTP_SPAN, "sb.conn": session, "sb.edge": edgeId, "sb.path": options.path }
      })
    }

    /**
     * A request's exchange was cut because its client stopped reading: the request is cancelled
     * towards its session as if the client had sent `notifications/cancelled`; the answer can no
     * longer reach anyone, and the tab should stop working on it (and stop sending what would be
     * dropped). A GET stream's session hears that it closed: its next (a resume) takes over.
     */
    const cancelled = (session: Subjects.ConnId, user: string, id: JsonRpc.Id) => (_exchange: HttpExchanges.ExchangeId, reason: string) => {
      const cancel = JsonRpc.encode({ jsonrpc: "2.0", method: "notifications/cancelled", params: { requestId: id, reason } })
      publish(Subjects.conn(options.service, session), cancel, frameHeaders(session, user, {}))
    }
    const streamClosed = (session: Subjects.ConnId, user: string) => (exchange: HttpExchanges.ExchangeId) =>
      publish(Subjects.conn(options.service, session), "", frameHeaders(session, user, { http: exchange, httpOp: "stream-closed" }))

    const publish = (subject: string, data: string, headers: Bus.Headers) => {
      try {
        bus.unsafePublish(subject, data, headers)
      } catch {
        // The bus is gone (shutting down): there is no session left to tell.
      }
    }

    /** Hands one message to the session's actor; a request's response waits in `exchanges` for the answer. */
    const forward = (res: Http.ServerResponse, session: Subjects.ConnId, user: string, body: Buffer, id: JsonRpc.Id | undefined) => {
      options.countFrame()
      const traced = receiveSpan(res, session)
      const traceparent = traced?.traceparent
      if (id === undefined) {
        bus.unsafePublish(Subjects.conn(options.service, session), body, frameHeaders(session, user, { traceparent }))
        traced?.span.end()
        res.writeHead(202).end()
        return
      }
      // A client that goes away is not heard: "Disconnection SHOULD NOT be interpreted as the
      // client cancelling its request" (MCP 2025-11-25, Streamable HTTP). Only a response the edge
      // cuts cancels its request.
      const n = exchanges.post({
        res,
        key: session,
        user,
        id,
        headers: { [SESSION]: session },
        about: { session, request: String(id) },
        onCut: cancelled(session, user, id)
      })
      bus.unsafePublish(Subjects.conn(options.service, session), body, frameHeaders(session, user, { traceparent, http: n }))
      traced?.span.end()
    }

    /** `initialize` without a session: the session's actor is opened as a socket's is, then takes the request. */
    const open = (req: Http.IncomingMessage, res: Http.ServerResponse, claims: Auth.Claims, body: Buffer, id: JsonRpc.Id) => {
      const session = Subjects.ConnId(randomUUID())
      const origin = req.headers.origin
      const event: EdgeProtocol.OpenEvent = {
        path: options.path,
        query: {},
        openedAt: Date.now(),
        ...(origin === undefined ? {} : { origin }),
        claims,
        transport: "http"
      }
      runFork(
        Actors.requestOpen(bus, options.service, session, edgeId, event, options.openTimeout).pipe(
          Effect.match({
            onFailure: (e) => {
              switch (e._tag) {
                // A policy refusal (the user's sessions are at their cap) is this client's to fix; anything else is the service's.
                case "OpenRefused":
                  return fail(res, e.code === EdgeProtocol.CloseCode.PolicyViolation ? 429 : 503, JsonRpc.ErrorCode.ServerError, `could not start the session: ${e.reason}`)
                default:
                  return e._tag === "PeerTimeout" || e.reason === "NoResponders"
                    ? fail(res, 503, JsonRpc.ErrorCode.ServerError, `${options.service} service unavailable`)
                    : fail(res, 500, JsonRpc.ErrorCode.InternalError, "could not start the session")
              }
            },
            onSuccess: () => {
              known.set(session, { user: claims.sub, until: Date.now() + config.sessionCache })
              if (!res.destroyed) forward(res, session, claims.sub, body, id)
            }
          })
        )
      )
    }

    // --- methods -----------------------------------------------------------------------------

    const post = (req: Http.IncomingMessage, res: Http.ServerResponse, claims: Auth.Claims) => {
      const refused = Checks.checkPost(req)
      if (refused !== undefined) return refuse(res, refused)
      Checks.readBody(req, res, config.maxBody, (body) => {
        try {
          received(req, res, claims, body)
        } catch (cause) {
          options.logCaught("edge: a Streamable HTTP request failed", cause, { method: "POST", url: loggable(req.url) })
          fail(res, 500, JsonRpc.ErrorCode.InternalError, "internal error")
        }
      })
    }

    const received = (req: Http.IncomingMessage, res: Http.ServerResponse, claims: Auth.Claims, body: Buffer) => {
      const parsed = Checks.parseMessage(body)
      if (Either.isLeft(parsed)) return fail(res, parsed.left.status, parsed.left.code, parsed.left.message)
      const { id, message, method } = parsed.right
      if (ModernRequest.isModern(req.headers, message)) return modern.handle(req, res, claims, message, body)
      const badVersion = Checks.checkVersion(req)
      if (badVersion !== undefined) return refuse(res, badVersion)
      const header = req.headers[SESSION]
      if (typeof header !== "string") {
        if (id !== undefined && method === "initialize") return open(req, res, claims, body, id)
        return refuse(res, { status: 400, why: "Mcp-Session-Id header is required (send initialize first)" })
      }
      sessionOf(header, claims.sub, (session) => {
        if (session === undefined) return fail(res, 404, JsonRpc.ErrorCode.ServerError, "Session not found")
        if (!res.destroyed) forward(res, session, claims.sub, body, id)
      }, () => fail(res, 503, JsonRpc.ErrorCode.ServerError, "session store unavailable"))
    }

    const get = (req: Http.IncomingMessage, res: Http.ServerResponse, claims: Auth.Claims) => {
      const refused = Checks.checkGet(req)
      if (refused !== undefined) return refuse(res, refused)
      const header = req.headers[SESSION]
      if (typeof header !== "string") return refuse(res, { status: 400, why: "Mcp-Session-Id header is required" })
      const lastEventId = req.headers["last-event-id"]
      sessionOf(header, claims.sub, (session) => {
        if (session === undefined) return fail(res, 404, JsonRpc.ErrorCode.ServerError, "Session not found")
        if (res.destroyed) return
        const version = req.headers["mcp-protocol-version"]
        // Its 200 waits for the session's actor to acknowledge it, so that nothing pushed after
        // the client has its answer is lost.
        const n = exchanges.stream({
          res,
          key: session,
          user: claims.sub,
          headers: { [SESSION]: session },
          about: { session },
          primes: typeof version === "string" && version >= "2025-11-25",
          onCut: streamClosed(session, claims.sub),
          onClosed: streamClosed(session, claims.sub)
        })
        const resumeFrom = typeof lastEventId === "string" ? lastEventId : undefined
        bus.unsafePublish(Subjects.conn(options.service, session), "", frameHeaders(session, claims.sub, { http: n, httpOp: "stream", lastEventId: resumeFrom }))
      }, () => fail(res, 503, JsonRpc.ErrorCode.ServerError, "session store unavailable"))
    }

    const del = (req: Http.IncomingMessage, res: Http.ServerResponse, claims: Auth.Claims) => {
      const header = req.headers[SESSION]
      if (typeof header !== "string") return refuse(res, { status: 400, why: "Mcp-Session-Id header is required" })
      sessionOf(header, claims.sub, (session) => {
        if (session === undefined) return fail(res, 404, JsonRpc.ErrorCode.ServerError, "Session not found")
        // As a socket's close: the actor ends, and Actors.host removes its record.
        bus.unsafePublish(
          Subjects.conn(options.service, session),
          "",
          Envelope.encodeEdgeIn({ _tag: "Closed", conn: session, edge: edgeId, code: EdgeProtocol.CloseCode.Normal, reason: "session deleted by the client" })
        )
        known.delete(session)
        gone.set(session, Date.now() + 10 * 60_000)
        res.writeHead(204).end()
      }, () => fail(res, 503, JsonRpc.ErrorCode.ServerError, "session store unavailable"))
    }

    const handle = (req: Http.IncomingMessage, res: Http.ServerResponse, url: URL) => {
      if (url.pathname === metadata.path) return metadata.handle(req, res)
      const foreign = Checks.checkOrigin(options.policy, req)
      if (foreign !== undefined) return refuse(res, foreign)
      const method = req.method
      if (method !== "POST" && method !== "GET" && method !== "DELETE") {
        return refuse(res, { status: 405, headers: { allow: "GET, POST, DELETE" } })
      }
      // A POST's version is checked once its era is known: a modern one says what is wrong in its own terms.
      const badVersion = method === "POST" ? undefined : Checks.checkVersion(req)
      if (badVersion !== undefined) return refuse(res, badVersion)
      const bearer = Checks.bearer(req, options.maxTokenBytes)
      if (bearer._tag === "Refused") return unauthorized(req, res, bearer.why, bearer.invalid)
      const authorized = (claims: Auth.Claims) => {
        if (res.destroyed) return
        try {
          if (method === "POST") post(req, res, claims)
          else if (method === "GET") get(req, res, claims)
          else del(req, res, claims)
        } catch (cause) {
          options.logCaught("edge: a Streamable HTTP request failed", cause, { method, url: loggable(req.url) })
          fail(res, 500, JsonRpc.ErrorCode.InternalError, "internal error")
        }
      }
      // A session's client sends its token with every request: one verified moments ago needs no fiber.
      const known = auth.known(bearer.token)
      if (known !== undefined) return authorized(known)
      runFork(
        auth.verify(bearer.token).pipe(
          Effect.match({
            onFailure: (e) =>
              e._tag === "AuthFailed"
                ? unauthorized(req, res, `invalid token: ${e.reason}`, true)
                : fail(res, 503, JsonRpc.ErrorCode.ServerError, e.reason),
            onSuccess: authorized
          })
        )
      )
    }

    /** A delivery names its exchange; what else it says is the exchange's. */
    const deliver = (delivery: Envelope.Exchange, data: Uint8Array) =>
      exchanges.deliver(delivery.http, { data, end: delivery.end, eventId: delivery.eventId, status: delivery.status, traceparent: delivery.traceparent })

    return {
      serves: (path) => path === options.path || path === metadata.path,
      handle,
      deliver,
      // Listen streams first: each ends with its request's result, which a plain end would skip.
      endStreams: () => modern.endStreams() + exchanges.endStreams()
    } satisfies StreamableHttpShape
  })
