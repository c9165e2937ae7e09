/**
 * Streamable HTTP (MCP 2025-03-26 and later) at the hub's path: the same registry session a
 * WebSocket `/hub` gets, over plain HTTP. The edge checks each request (Origin, token, headers,
 * size), opens the session's actor on `initialize` as it opens a socket's, forwards each message
 * over the bus, and holds the response until the actor's deliveries come back: JSON for a lone
 * answer, SSE once a notification comes first. A session id is its actor's connection id, so any
 * edge serves any session; only exchanges in flight live here.
 */
import { AuthClient } from "@switchboard/auth"
import * as AuthConfig from "@switchboard/auth/Config"
import { Actors, Bus, Kv, Subjects } from "@switchboard/bus"
import { type Auth, Edge as EdgeProtocol, Json, JsonRpc, Registry } from "@switchboard/protocol"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import type * as ConfigError from "effect/ConfigError"
import type * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import * as Http from "node:http"
import * as EdgeConfig from "./Config.ts"
import type { EdgeMetrics } from "./Metrics.ts"
import { type OriginPolicy, quoted } from "./OriginPolicy.ts"
import { headerToken, loggable, tokenTooLong } from "./Requests.ts"
import { type Span, SpanKind } from "@opentelemetry/api"
import { Telemetry } from "@switchboard/telemetry"

export const METADATA_PATH = "/.well-known/oauth-protected-resource"

export interface StreamableHttpShape {
  /** Whether a plain HTTP request at this path is answered here. */
  readonly serves: (path: string) => boolean
  readonly handle: (req: Http.IncomingMessage, res: Http.ServerResponse, url: URL) => void
  /** A delivery to one of this edge's exchanges (it carries `sb-http`). */
  readonly deliver: (m: Bus.BusMessage) => void
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

/**
 * A response and what waits in it for its client. A client that stops reading would have the edge
 * hold all that is written to it, so each is watched: a write that would take what waits over
 * EDGE_OUTBOUND_HWM cuts it, and so do bytes that have not moved for EDGE_HTTP_WRITE_STALL. Node
 * tells nothing of a write in progress, only of writes done: what has left is the bytes written
 * (`queued`) less what still waits.
 */
interface Outbound {
  /** Its key in `exchanges` while it is open. */
  readonly n: number
  readonly res: Http.ServerResponse
  readonly session: Subjects.ConnId
  readonly user: string
  queued: number
  /** What had left at the last look that saw it move, and when; undefined while nothing waits. */
  left: number
  movedAt: number | undefined
}

/** A POST whose request waits for its answer. It becomes an SSE stream when a notification comes first. */
interface Pending extends Outbound {
  readonly kind: "post"
  readonly id: JsonRpc.Id
  readonly timer: ReturnType<typeof setTimeout>
  sse: boolean
}

/**
 * A GET stream: the session's own messages (`list_changed`), with event ids. Its 200 waits for the
 * session's actor to acknowledge it, so that nothing pushed after the client has its answer is lost.
 */
interface Stream extends Outbound {
  readonly kind: "stream"
  /** Until the acknowledgement; a 504 when it does not come. */
  timer: ReturnType<typeof setTimeout> | undefined
  /**
   * The client takes an event with an id and empty data (MCP 2025-11-25 on), so the stream opens
   * with one: a client cut before the first event then resumes from it, missing nothing.
   */
  readonly primes: boolean
}

const SESSION = "mcp-session-id"
const isVersion = (v: string): boolean => (Registry.HttpProtocolVersions as ReadonlyArray<string>).includes(v)

/** Whether an Accept header admits `type` (exactly, as `major/*`, or as `*\/*`). */
export const accepts = (accept: string | undefined, type: string): boolean => {
  if (accept === undefined) return false
  // A client sends the same header with every request: the answer is worked out once (for
  // headers of a sane length; any peer can send any header).
  if (accept.length > 256) return admits(accept, type)
  const key = `${type} ${accept}`
  const known = acceptsSeen.get(key)
  if (known !== undefined) return known
  const answer = admits(accept, type)
  if (acceptsSeen.size >= 1024) acceptsSeen.clear()
  acceptsSeen.set(key, answer)
  return answer
}
const acceptsSeen = new Map<string, boolean>()

const admits = (accept: string, type: string): boolean => {
  const major = `${type.slice(0, type.indexOf("/"))}/*`
  return accept.split(",").some((part) => {
    const essence = part.split(";")[0]!.trim().toLowerCase()
    return essence === type || essence === major || essence === "*/*"
  })
}

const essenceOf = (contentType: string | undefined) => (contentType ?? "").split(";")[0]!.trim().toLowerCase()

/** One SSE event; a line break inside `data` would end the field, so each line gets its own. */
const sseEvent = (data: string, id: string | undefined) =>
  `${id === undefined ? "" : `id: ${id}\n`}data: ${data.includes("\n") ? data.split(/\r?\n/).join("\ndata: ") : data}\n\n`

const SSE_HEADERS = { "content-type": "text/event-stream", "cache-control": "no-cache, no-transform", connection: "keep-alive" } as const

const failureBody = (code: number, message: string, id: JsonRpc.Id | null = null) => JsonRpc.encode(JsonRpc.errorResponse(id, code, message))

export const make = (
  options: StreamableHttpOptions
): Effect.Effect<StreamableHttpShape, Bus.BusError | ConfigError.ConfigError, Bus.Bus | Kv.Kv | AuthClient.AuthClient | Telemetry.Tracing | Scope.Scope> =>
  Effect.gen(function*() {
    const { tracer } = yield* Telemetry.Tracing
    const bus = yield* Bus.Bus
    const auth = yield* AuthClient.AuthClient
    const connections = Kv.typed(yield* (yield* Kv.Kv).bucket(Subjects.Bucket.connections), Actors.ConnectionRecord)
    const config = {
      maxBody: yield* EdgeConfig.httpMaxBody,
      keepAlive: yield* EdgeConfig.httpKeepAlive,
      responseTimeout: Duration.toMillis(yield* EdgeConfig.httpResponseTimeout),
      sessionCache: Duration.toMillis(yield* EdgeConfig.httpSessionCache),
      hwm: yield* EdgeConfig.outboundHighWaterMark,
      writeStall: yield* EdgeConfig.httpWriteStall,
      issuer: yield* AuthConfig.issuer
    }
    const { edgeId, runFork } = options
    const exchanges = new Map<number, Pending | Stream>()
    /** Responses ended with bytes still waiting: watched until they leave. */
    const draining = new Set<Pending | Stream>()
    let nextExchange = 0
    /** Sessions found in KV, with their user, trusted for a moment; and sessions deleted here, never trusted again. */
    const known = new Map<Subjects.ConnId, { readonly user: string | undefined; readonly until: number }>()
    const gone = new Map<Subjects.ConnId, number>()

    // Idle SSE streams get a comment now and then, or a proxy in between may cut them.
    const keepAlive = setInterval(() => {
      const now = Date.now()
      // A GET stream its session has not acknowledged has no headers yet: a write would send a bare 200.
      for (const ex of exchanges.values()) if (ex.kind === "stream" ? ex.timer === undefined : ex.sse) write(ex, ": keep-alive\n\n")
      for (const [id, entry] of known) if (entry.until <= now) known.delete(id)
      for (const [id, until] of gone) if (until <= now) gone.delete(id)
    }, Duration.toMillis(config.keepAlive))
    keepAlive.unref()
    yield* Effect.addFinalizer(() => Effect.sync(() => clearInterval(keepAlive)))

    // --- what waits for clients ---------------------------------------------------------------

    const stallMillis = Duration.toMillis(config.writeStall)
    const stallText = Duration.format(config.writeStall)

    /** Writes to an open response; false when the write would take what waits over the bound, and the response was cut instead. */
    const write = (ex: Pending | Stream, chunk: string): boolean => {
      const res = ex.res
      if (res.destroyed) return false
      const bytes = Buffer.byteLength(chunk)
      const waiting = res.writableLength
      // A message larger than the bound still goes to a client that has taken all before it: what
      // waits is then that one message, which the frame limits bound.
      if (waiting > 0 && waiting + bytes > config.hwm) {
        cut(ex, "buffer", waiting)
        return false
      }
      ex.queued += bytes
      res.write(chunk)
      return true
    }

    /** A response has its last bytes; until they leave, it is watched for a stall. */
    const ended = (ex: Pending | Stream) => {
      if (ex.res.writableLength > 0 && !ex.res.destroyed) draining.add(ex)
    }

    /**
     * Cuts a response whose client stopped reading. A POST's request is cancelled towards its
     * session as if the client had sent `notifications/cancelled`: the answer can no longer reach
     * anyone, and the tab should stop working on it (and stop sending what would be dropped).
     */
    const cut = (ex: Pending | Stream, why: "buffer" | "stall", waiting: number) => {
      const open = exchanges.get(ex.n) === ex
      exchanges.delete(ex.n)
      draining.delete(ex)
      clearTimeout(ex.timer)
      const reason = why === "buffer"
        ? `slow consumer: more than ${config.hwm} bytes waiting (EDGE_OUTBOUND_HWM)`
        : `stalled: ${waiting} bytes waiting, unmoved for ${stallText} (EDGE_HTTP_WRITE_STALL)`
      options.metrics.httpCut(why)
      runFork(
        Effect.logWarning(`edge: cut a Streamable HTTP ${ex.kind === "post" ? "response" : "GET stream"}: ${reason}`).pipe(
          Effect.annotateLogs({ session: ex.session, user: ex.user, ...(ex.kind === "post" ? { request: String(ex.id), answered: String(!open) } : {}) })
        )
      )
      ex.res.destroy()
      if (!open) return
      const subject = Subjects.conn(options.service, ex.session)
      try {
        if (ex.kind === "post") {
          const cancel = JsonRpc.encode({ jsonrpc: "2.0", method: "notifications/cancelled", params: { requestId: ex.id, reason } })
          bus.unsafePublish(subject, cancel, frameHeaders(ex.session, ex.user, {}))
        } else {
          // The session's next GET stream (a resume with Last-Event-ID) takes over.
          bus.unsafePublish(subject, "", frameHeaders(ex.session, ex.user, { [Subjects.Header.http]: String(ex.n), [Subjects.Header.httpOp]: "stream-closed" }))
        }
      } catch {
        // The bus is gone (shutting down): there is no session left to tell.
      }
    }

    /** Whether what waits in `ex` has moved since the last look; a response stuck for the stall is cut. */
    const look = (ex: Pending | Stream, now: number) => {
      const waiting = ex.res.writableLength
      if (waiting === 0) return void (ex.movedAt = undefined)
      const left = ex.queued - waiting
      if (ex.movedAt === undefined || left > ex.left) {
        ex.left = left
        ex.movedAt = now
      } else if (now - ex.movedAt >= stallMillis) cut(ex, "stall", waiting)
    }

    const watch = setInterval(() => {
      try {
        const now = Date.now()
        for (const ex of exchanges.values()) if (!ex.res.destroyed) look(ex, now)
        for (const ex of draining) {
          if (ex.res.destroyed || ex.res.writableFinished) draining.delete(ex)
          else look(ex, now)
        }
      } catch (cause) {
        options.logCaught("edge: watching Streamable HTTP responses failed", cause, {})
      }
    }, Math.min(1000, Math.max(50, stallMillis / 4)))
    watch.unref()
    yield* Effect.addFinalizer(() => Effect.sync(() => clearInterval(watch)))

    /** From EDGE_PUBLIC_URL, or a Host checked to be one: a client's Host goes into a header and a document. */
    const baseUrl = (req: Http.IncomingMessage) => options.policy.baseUrl(req.headers.host)

    const metadata = (req: Http.IncomingMessage) => ({
      resource: `${baseUrl(req)}${options.path}`,
      ...(Option.isSome(config.issuer) ? { authorization_servers: [config.issuer.value] } : {}),
      bearer_methods_supported: ["header"]
    })

    /** Every answer of this module but a success: a JSON-RPC error body, as the SDK's own server sends. */
    const fail = (res: Http.ServerResponse, status: number, code: number, message: string, headers: Readonly<Record<string, string>> = {}) => {
      if (res.headersSent) return void res.destroy()
      const body = failureBody(code, message)
      res.writeHead(status, { ...headers, "content-type": "application/json", "content-length": Buffer.byteLength(body) })
      res.end(body)
    }

    /**
     * A refusal whose status says what is wrong: the message opens with the status's reason phrase
     * (Node's own `STATUS_CODES`), then says why, if there is more to say.
     */
    const refuse = (res: Http.ServerResponse, status: number, why?: string, headers?: Readonly<Record<string, string>>) => {
      const phrase = Http.STATUS_CODES[status] ?? `HTTP ${status}`
      fail(res, status, JsonRpc.ErrorCode.ServerError, why === undefined ? phrase : `${phrase}: ${why}`, headers)
    }

    const unauthorized = (req: Http.IncomingMessage, res: Http.ServerResponse, why: string, invalid: boolean) =>
      refuse(res, 401, why, {
        "www-authenticate": `Bearer${invalid ? ` error="invalid_token",` : ""} resource_metadata=${quoted(`${baseUrl(req)}${METADATA_PATH}`)}`
      })

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

    const frameHeaders = (session: Subjects.ConnId, user: string, extra: Readonly<Record<string, string>>): Bus.Headers => ({
      [Subjects.Header.op]: "frame",
      [Subjects.Header.conn]: session,
      [Subjects.Header.edge]: edgeId,
      [Subjects.Header.user]: user,
      ...extra
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

    /** Hands one message to the session's actor; a request's response waits in `exchanges` for the answer. */
    const forward = (res: Http.ServerResponse, session: Subjects.ConnId, user: string, body: Buffer, id: JsonRpc.Id | undefined) => {
      options.countFrame()
      const traced = receiveSpan(res, session)
      const trace = traced === undefined ? {} : { traceparent: traced.traceparent }
      if (id === undefined) {
        bus.unsafePublish(Subjects.conn(options.service, session), body, frameHeaders(session, user, trace))
        traced?.span.end()
        res.writeHead(202).end()
        return
      }
      const n = ++nextExchange
      const timer = setTimeout(() => timedOut(n), config.responseTimeout)
      const pending: Pending = { kind: "post", n, res, session, user, id, timer, sse: false, queued: 0, left: 0, movedAt: undefined }
      exchanges.set(n, pending)
      // The client went away; its answer, when it comes, has nowhere to go. Not a cancellation:
      // "Disconnection SHOULD NOT be interpreted as the client cancelling its request" (MCP
      // 2025-11-25, Streamable HTTP). Only a response the edge cuts (`cut`) cancels its request.
      res.once("close", () => {
        if (exchanges.get(n) === pending) exchanges.delete(n)
        clearTimeout(timer)
      })
      bus.unsafePublish(Subjects.conn(options.service, session), body, frameHeaders(session, user, { ...trace, [Subjects.Header.http]: String(n) }))
      traced?.span.end()
    }

    const timedOut = (n: number) => {
      const ex = exchanges.get(n)
      if (ex === undefined) return
      if (ex.kind === "stream") {
        // Its actor never took it: the client may try again, and the actor forgets it if it ever does.
        if (!ex.res.destroyed) fail(ex.res, 504, JsonRpc.ErrorCode.InternalError, "the session did not open the stream in time")
        return
      }
      exchanges.delete(n)
      if (ex.sse) {
        ex.res.end()
        return ended(ex)
      }
      const body = failureBody(JsonRpc.ErrorCode.InternalError, "the session did not answer in time", ex.id)
      ex.res.writeHead(504, { "content-type": "application/json", "content-length": Buffer.byteLength(body) }).end(body)
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
      if (!accepts(req.headers.accept, "application/json") || !accepts(req.headers.accept, "text/event-stream")) {
        return refuse(res, 406, "a POST must accept both application/json and text/event-stream")
      }
      if (essenceOf(req.headers["content-type"]) !== "application/json") {
        return refuse(res, 415, "the body must be application/json")
      }
      const tooLarge = () =>
        refuse(res, 413, `a message may have at most ${config.maxBody} bytes`, { connection: "close" })
      const declared = Number(req.headers["content-length"] ?? 0)
      if (declared > config.maxBody) return tooLarge()
      const chunks: Array<Buffer> = []
      let size = 0
      let over = false
      req.on("data", (chunk: Buffer) => {
        if (over) return
        size += chunk.byteLength
        if (size > config.maxBody) {
          over = true
          chunks.length = 0
          tooLarge()
        } else chunks.push(chunk)
      })
      req.on("end", () => {
        if (over) return
        try {
          received(req, res, claims, Buffer.concat(chunks))
        } catch (cause) {
          options.logCaught("edge: a Streamable HTTP request failed", cause, { method: "POST", url: loggable(req.url) })
          fail(res, 500, JsonRpc.ErrorCode.InternalError, "internal error")
        }
      })
    }

    const received = (req: Http.IncomingMessage, res: Http.ServerResponse, claims: Auth.Claims, body: Buffer) => {
      const parsed = Json.parse(body.toString("utf8"))
      if (Either.isLeft(parsed)) return fail(res, 400, JsonRpc.ErrorCode.ParseError, `Parse error: ${parsed.left}`)
      const message = parsed.right
      if (Array.isArray(message)) return fail(res, 400, JsonRpc.ErrorCode.InvalidRequest, "Invalid Request: batches are not supported; send one message per POST")
      if (!JsonRpc.isRecord(message)) return fail(res, 400, JsonRpc.ErrorCode.InvalidRequest, "Invalid Request: expected a JSON-RPC message object")
      const rawId = message["id"]
      // Requests wait for their answer; notifications and responses are accepted at once.
      const id = typeof message["method"] === "string" && (typeof rawId === "string" || typeof rawId === "number") ? rawId : undefined
      const header = req.headers[SESSION]
      if (typeof header !== "string") {
        if (id !== undefined && message["method"] === "initialize") return open(req, res, claims, body, id)
        return refuse(res, 400, "Mcp-Session-Id header is required (send initialize first)")
      }
      sessionOf(header, claims.sub, (session) => {
        if (session === undefined) return fail(res, 404, JsonRpc.ErrorCode.ServerError, "Session not found")
        if (!res.destroyed) forward(res, session, claims.sub, body, id)
      }, () => fail(res, 503, JsonRpc.ErrorCode.ServerError, "session store unavailable"))
    }

    const get = (req: Http.IncomingMessage, res: Http.ServerResponse, claims: Auth.Claims) => {
      if (!accepts(req.headers.accept, "text/event-stream")) {
        return refuse(res, 406, "a GET must accept text/event-stream")
      }
      const header = req.headers[SESSION]
      if (typeof header !== "string") return refuse(res, 400, "Mcp-Session-Id header is required")
      const lastEventId = req.headers["last-event-id"]
      sessionOf(header, claims.sub, (session) => {
        if (session === undefined) return fail(res, 404, JsonRpc.ErrorCode.ServerError, "Session not found")
        if (res.destroyed) return
        const n = ++nextExchange
        const version = req.headers["mcp-protocol-version"]
        const stream: Stream = {
          kind: "stream",
          n,
          res,
          session,
          user: claims.sub,
          queued: 0,
          left: 0,
          movedAt: undefined,
          timer: setTimeout(() => timedOut(n), config.responseTimeout),
          primes: typeof version === "string" && version >= "2025-11-25"
        }
        exchanges.set(n, stream)
        const subject = Subjects.conn(options.service, session)
        const control = (op: string, extra: Readonly<Record<string, string>> = {}) =>
          frameHeaders(session, claims.sub, { [Subjects.Header.http]: String(n), [Subjects.Header.httpOp]: op, ...extra })
        res.once("close", () => {
          clearTimeout(stream.timer)
          if (exchanges.get(n) !== stream) return
          exchanges.delete(n)
          bus.unsafePublish(subject, "", control("stream-closed"))
        })
        bus.unsafePublish(subject, "", control("stream", typeof lastEventId === "string" ? { [Subjects.Header.lastEventId]: lastEventId } : {}))
      }, () => fail(res, 503, JsonRpc.ErrorCode.ServerError, "session store unavailable"))
    }

    const del = (req: Http.IncomingMessage, res: Http.ServerResponse, claims: Auth.Claims) => {
      const header = req.headers[SESSION]
      if (typeof header !== "string") return refuse(res, 400, "Mcp-Session-Id header is required")
      sessionOf(header, claims.sub, (session) => {
        if (session === undefined) return fail(res, 404, JsonRpc.ErrorCode.ServerError, "Session not found")
        // As a socket's close: the actor ends, and Actors.host removes its record.
        bus.unsafePublish(Subjects.conn(options.service, session), "", {
          [Subjects.Header.op]: "closed",
          [Subjects.Header.conn]: session,
          [Subjects.Header.edge]: edgeId,
          [Subjects.Header.code]: String(EdgeProtocol.CloseCode.Normal),
          [Subjects.Header.reason]: "session deleted by the client"
        })
        known.delete(session)
        gone.set(session, Date.now() + 10 * 60_000)
        res.writeHead(204).end()
      }, () => fail(res, 503, JsonRpc.ErrorCode.ServerError, "session store unavailable"))
    }

    const handle = (req: Http.IncomingMessage, res: Http.ServerResponse, url: URL) => {
      if (url.pathname === METADATA_PATH) {
        if (req.method !== "GET") return refuse(res, 405, undefined, { allow: "GET" })
        const body = JSON.stringify(metadata(req))
        return void res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) }).end(body)
      }
      // A page may not reach a user's sessions from a foreign origin.
      const foreign = options.policy.checkOrigin(req.headers.origin)
      if (foreign !== undefined) return refuse(res, foreign.status, foreign.message)
      const method = req.method
      if (method !== "POST" && method !== "GET" && method !== "DELETE") {
        return refuse(res, 405, undefined, { allow: "GET, POST, DELETE" })
      }
      const version = req.headers["mcp-protocol-version"]
      if (typeof version === "string" && !isVersion(version)) {
        return refuse(res, 400, `unsupported MCP-Protocol-Version ${version} (supported: ${Registry.HttpProtocolVersions.join(", ")})`)
      }
      const token = headerToken(req)
      if (token === undefined) return unauthorized(req, res, "a bearer token is required (Authorization header)", false)
      const tooLong = tokenTooLong(token, options.maxTokenBytes)
      if (tooLong !== undefined) return unauthorized(req, res, `invalid token: ${tooLong}`, true)
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
      const known = auth.known(token)
      if (known !== undefined) return authorized(known)
      runFork(
        auth.verify(token).pipe(
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

    const deliver = (m: Bus.BusMessage) => {
      const n = Number(m.header(Subjects.Header.http))
      const ex = exchanges.get(n)
      if (ex === undefined) return
      const end = m.header(Subjects.Header.httpEnd) === "1"
      const data = m.data
      if (ex.kind === "stream") {
        if (ex.timer !== undefined) {
          clearTimeout(ex.timer)
          ex.timer = undefined
          ex.res.writeHead(200, { ...SSE_HEADERS, [SESSION]: ex.session })
          const id = m.header(Subjects.Header.eventId)
          if (ex.primes && id !== undefined) write(ex, `id: ${id}\ndata: \n\n`)
          else ex.res.flushHeaders()
        }
        if (data.byteLength > 0 && !write(ex, sseEvent(Bus.text(m), m.header(Subjects.Header.eventId)))) return
        if (end) {
          exchanges.delete(n)
          ex.res.end()
          ended(ex)
        }
        return
      }
      ex.timer.refresh()
      const traceparent = m.header(Subjects.Header.traceparent)
      if (end && traceparent !== undefined && Option.isSome(tracer)) {
        Telemetry.startSpan(tracer.value, "edge.deliver", traceparent, {
          kind: SpanKind.PRODUCER,
          attributes: { ...HTTP_SPAN, "sb.conn": ex.session, "sb.edge": edgeId }
        }).span.end()
      }
      if (!ex.sse) {
        if (end) {
          exchanges.delete(n)
          clearTimeout(ex.timer)
          // A request cancelled by the client ends with nothing to say.
          if (data.byteLength === 0) return void ex.res.writeHead(202).end()
          ex.res.writeHead(200, { "content-type": "application/json", "content-length": data.byteLength, [SESSION]: ex.session }).end(data)
          return ended(ex)
        }
        // A notification before the answer: the response becomes a stream (the POST accepted one).
        ex.sse = true
        ex.res.writeHead(200, { ...SSE_HEADERS, [SESSION]: ex.session })
      }
      if (data.byteLength > 0 && !write(ex, sseEvent(Bus.text(m), undefined))) return
      if (end) {
        exchanges.delete(n)
        clearTimeout(ex.timer)
        ex.res.end()
        ended(ex)
      }
    }

    const endStreams = () => {
      let ended = 0
      for (const ex of exchanges.values()) {
        if (ex.kind !== "stream") continue
        ex.res.end()
        ended++
      }
      return ended
    }

    return {
      serves: (path) => path === options.path || path === METADATA_PATH,
      handle,
      deliver,
      endStreams
    } satisfies StreamableHttpShape
  })
