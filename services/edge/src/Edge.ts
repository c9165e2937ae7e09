/**
 * The edge: terminates WebSockets and moves raw text frames between sockets and the bus. It
 * authenticates upgrades, enforces Origin, frame size, rate, ping/pong and backpressure, and knows
 * nothing about the protocols above. The socket loop is plain callbacks on purpose: it runs once
 * per frame, and an Effect per frame would cost more than the relay itself.
 */
import { AuthClient } from "@switchboard/auth"
import { Actors, Bus, ConnectionLimit, Kv, RateBudget, Subjects } from "@switchboard/bus"
import { type Auth, Edge as EdgeProtocol, Settings } from "@switchboard/protocol"
import { Metrics, Telemetry } from "@switchboard/telemetry"
import { type Span, SpanKind } from "@opentelemetry/api"
import * as Cause from "effect/Cause"
import type * as ConfigError from "effect/ConfigError"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as FiberSet from "effect/FiberSet"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import { randomBytes, randomUUID } from "node:crypto"
import * as Http from "node:http"
import type { Duplex } from "node:stream"
import { WebSocket, WebSocketServer } from "ws"
import * as EdgeConfig from "./Config.ts"
import * as Embed from "./Embed.ts"
import { EdgeMetrics } from "./Metrics.ts"
import { type HttpRouteTable, type Route, type RouteTable, standard, standardHttp } from "./Routes.ts"
import * as StreamableHttp from "./StreamableHttp.ts"

const CloseCode = EdgeProtocol.CloseCode

export interface EdgeServerShape {
  readonly id: Subjects.EdgeId
  /** The bound port (useful with PORT=0). */
  readonly port: number
  readonly url: string
  readonly metrics: EdgeMetrics
  readonly connections: () => number
}

export class EdgeServer extends Context.Tag("@switchboard/edge/EdgeServer")<EdgeServer, EdgeServerShape>() {}

export interface EdgeOptions {
  readonly routes?: RouteTable
  readonly httpRoutes?: HttpRouteTable
}

/** Largest HTTP request body the edge forwards to a service. */
const MAX_HTTP_BODY = 64 * 1024

interface Socket {
  readonly id: Subjects.ConnId
  readonly ws: WebSocket
  /** The peer's address, for logs. */
  readonly remote: string
  /** The TCP socket under `ws`, corked while a burst of deliveries is written. */
  readonly raw: Duplex
  corked: boolean
  readonly path: string
  readonly route: Route
  readonly subject: string
  readonly frameHeaders: Bus.Headers
  readonly limitedHeaders: Bus.Headers
  readonly budget: RateBudget
  state: "opening" | "open" | "closed"
  /** Frames that arrived before the service took the connection, or while it is held. */
  pending: Array<readonly [Buffer, boolean]>
  /**
   * The hand-off (its token) that holds this connection's frames: its actor moves to another
   * replica, and frames wait here until it listens (see `@switchboard/bus/Handoff`).
   */
  held: string | undefined
  holdTimer: ReturnType<typeof setTimeout> | undefined
  closedWith: readonly [number, string] | undefined
  alive: boolean
  /**
   * The code and reason the edge (or ws, for a frame it refused) closed with, when it closed
   * first: what the metrics count and the service is told, since the peer's own close may never
   * come (a peer that stops reading is terminated, and shows up as 1006).
   */
  sentClose: readonly [number, string] | undefined
  /** Terminates a peer that does not answer the edge's close; cleared once the socket is closed. */
  closeTimer: ReturnType<typeof setTimeout> | undefined
  /** For the access log's close line. */
  readonly openedAt: number
  readonly user: string | undefined
  framesIn: number
  framesOut: number
}

const MAX_PENDING_FRAMES = 1024
/**
 * A hand-off takes a round trip or two between replicas; one whose replica died midway is never
 * released, so the edge lets go of the frames itself after this long (longer than any service's
 * shutdown grace), to whoever owns the connection by then.
 */
const HOLD_LIMIT_MS = 30_000

const encodeHeartbeat = Schema.encodeSync(Schema.parseJson(EdgeProtocol.EdgeHeartbeat))
const encodeHttpRequest = Schema.encodeSync(Schema.parseJson(EdgeProtocol.HttpRequest))
const decodeHttpResponse = Schema.decodeUnknownEither(Schema.parseJson(EdgeProtocol.HttpResponse))

/**
 * Targets without a query, parsed once each: a handful of paths (`/hub`) take nearly every
 * request, and `new URL` cost 6% of the server's CPU at 1×1 over Streamable HTTP. Shared, so never
 * changed; bounded, since any peer can send any path.
 */
const plainTargets = new Map<string, URL | undefined>()

/**
 * A request's target as a URL, or undefined when it is not one (`//`, `http://[::1`): any peer
 * can send any target, and `new URL` throws on those.
 */
const targetOf = (req: Http.IncomingMessage): URL | undefined => {
  const raw = req.url ?? "/"
  const plain = raw.length <= 256 && !raw.includes("?")
  if (plain && plainTargets.has(raw)) return plainTargets.get(raw)
  let url: URL | undefined
  try {
    url = new URL(raw, "http://edge")
  } catch {
    url = undefined
  }
  if (plain) {
    if (plainTargets.size >= 1024) plainTargets.clear()
    plainTargets.set(raw, url)
  }
  return url
}

/** A request target as logs may show it: a `token` in the query is a credential, and is left out. */
const loggable = (target: string | undefined) => (target ?? "").replace(/([?&]token=)[^&#]*/gi, "$1…")

/** What a log line says about the request an error happened in. */
const requestLog = (req: Http.IncomingMessage) => ({
  method: req.method ?? "",
  url: loggable(req.url),
  remote: req.socket.remoteAddress ?? "unknown"
})

/** How long a refused upgrade's socket may wait for the peer to close its side before it is destroyed. */
const REFUSED_LINGER_MS = 2000

/**
 * A close frame holds at most 123 bytes of reason, and ws throws on more. Services word reasons
 * freely (an auth error's text, a parse error's message), so a long one is cut here, on whole
 * characters, to 120 bytes and an ellipsis.
 */
const fitCloseReason = (reason: string) => {
  if (Buffer.byteLength(reason) <= 123) return reason
  let cut = reason.slice(0, 120)
  while (Buffer.byteLength(cut) > 120) cut = cut.slice(0, -1)
  return `${cut}...`
}

/**
 * Answers an upgrade request with a plain HTTP error and closes the TCP socket, at once if the
 * peer does not close its side soon: a refused socket must not linger, holding its slot.
 */
const refuseUpgrade = (socket: Duplex, status: number, message: string) => {
  if (!socket.writable) return socket.destroy()
  const body = `${message}\n`
  socket.end(
    `HTTP/1.1 ${status} ${Http.STATUS_CODES[status] ?? "Error"}\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
  )
  setTimeout(() => socket.destroy(), REFUSED_LINGER_MS).unref()
}

const bearer = (req: Http.IncomingMessage, url: URL): string | undefined => {
  const header = req.headers.authorization
  if (header !== undefined) {
    const m = /^Bearer\s+(.+)$/i.exec(header.trim())
    if (m !== null) return m[1]
  }
  return url.searchParams.get("token") ?? undefined
}

const make = (options: EdgeOptions) =>
  Effect.gen(function*() {
    const bus = yield* Bus.Bus
    const kv = yield* Kv.Kv
    const auth = yield* AuthClient.AuthClient
    const { tracer } = yield* Telemetry.Tracing
    const routes = options.routes ?? standard
    const httpRoutes = Object.entries(options.httpRoutes ?? standardHttp)
    const config = {
      port: yield* EdgeConfig.port,
      host: yield* EdgeConfig.host,
      origins: yield* EdgeConfig.allowedOrigins,
      maxPayload: yield* EdgeConfig.maxPayload,
      maxPayloadByPath: yield* EdgeConfig.maxPayloadByPath,
      pingInterval: yield* EdgeConfig.pingInterval,
      hwm: yield* EdgeConfig.outboundHighWaterMark,
      rate: yield* EdgeConfig.rateLimit,
      burst: yield* EdgeConfig.rateBurst,
      openTimeout: yield* EdgeConfig.openTimeout,
      heartbeat: yield* EdgeConfig.heartbeatInterval,
      grace: yield* EdgeConfig.shutdownGrace,
      perAddress: yield* EdgeConfig.maxConnectionsPerAddress,
      perUser: yield* EdgeConfig.maxConnectionsPerUser,
      headersTimeout: yield* EdgeConfig.headersTimeout,
      requestTimeout: yield* EdgeConfig.requestTimeout
    }
    if (Duration.greaterThan(config.headersTimeout, config.requestTimeout)) {
      return yield* Effect.dieMessage("EDGE_HEADERS_TIMEOUT must be at most EDGE_REQUEST_TIMEOUT")
    }
    const edgeId = Subjects.EdgeId(
      Option.getOrElse(yield* EdgeConfig.edgeId, () => `edge-${randomBytes(6).toString("hex")}`)
    )
    const anyOrigin = config.origins.includes("*")
    if (anyOrigin) {
      yield* Effect.logWarning("ALLOWED_ORIGINS is *: any web page may open sockets here; set an allow-list in production")
    }

    const metrics = new EdgeMetrics()
    // Also on the process's metrics port, next to the services' metrics in the all-in-one.
    yield* Effect.acquireRelease(Effect.map(Metrics.Metrics, (registry) => registry.include(() => metrics.render())), (remove) => Effect.sync(remove))
    const sockets = new Map<Subjects.ConnId, Socket>()
    let shuttingDown = false
    const fibers = yield* FiberSet.make()
    const runFork = yield* FiberSet.runtime(fibers)<never>()
    const byAddress = new ConnectionLimit(config.perAddress)
    const byUser = new ConnectionLimit(config.perUser)

    /**
     * Logs an exception caught at a boundary (a request, an upgrade, a socket's event, a bus
     * message): a bug there costs that request or socket, never the process and everyone on it.
     */
    const logCaught = (what: string, cause: unknown, about: Readonly<Record<string, string>>) => {
      try {
        runFork(Effect.logError(what, Cause.die(cause)).pipe(Effect.annotateLogs(about)))
      } catch {
        // Logging after shutdown has nowhere to go.
      }
    }

    /** Frames read in this turn of the event loop, from sockets or as HTTP requests (see `send`). */
    let framesThisTurn = 0
    const newTurn = () => {
      framesThisTurn = 0
    }
    const countFrame = () => {
      if (framesThisTurn++ === 0) setImmediate(newTurn)
    }

    // Plain HTTP at the hub's path is Streamable HTTP: the same sessions, without a socket.
    const hub = routes["/hub"]
    const streamable = hub === undefined
      ? undefined
      : yield* StreamableHttp.make({
        edgeId,
        path: "/hub",
        service: hub.service,
        origins: config.origins,
        openTimeout: config.openTimeout,
        runFork,
        logCaught,
        countFrame
      })

    const embed = yield* Embed.make

    // --- outbound: what services send to this edge's sockets -------------------------------

    // Deliveries arrive in bursts: one read from the bus holds many, and one turn of the event
    // loop reads many sockets. A socket is corked from its first delivery until the turn ends, so
    // that a burst leaves in one write. A turn that has read at most one frame is no burst (a lone
    // request, or a read from the bus): its writes leave once the deliveries it made are done, at
    // the next microtask checkpoint, instead of after the rest of the turn: at 1×1, 2 µs from
    // delivery to write where the end of the turn took 3.8 (instrumented all-in-one, `/hub` calls).
    const corked: Array<Socket> = []
    const uncorkAll = () => {
      for (const s of corked) {
        s.corked = false
        s.raw.uncork()
      }
      corked.length = 0
    }

    const send = (s: Socket, data: Uint8Array) => {
      if (s.state === "closed" || s.ws.readyState !== WebSocket.OPEN) return
      if (s.ws.bufferedAmount + data.byteLength > config.hwm) {
        closeSocket(s, CloseCode.TryAgainLater, "slow consumer: outbound buffer full")
        return
      }
      metrics.framesOut++
      s.framesOut++
      metrics.bytesOut += data.byteLength
      if (!s.corked) {
        s.corked = true
        s.raw.cork()
        if (corked.push(s) === 1) {
          if (framesThisTurn <= 1) queueMicrotask(uncorkAll)
          else setImmediate(uncorkAll)
        }
      }
      s.ws.send(data, { binary: false })
    }

    const deliverSpan = (traceparent: string | undefined, conns: string): Span | undefined =>
      Option.isNone(tracer) || traceparent === undefined
        ? undefined
        : Telemetry.startSpan(tracer.value, "edge.deliver", traceparent, {
          kind: SpanKind.PRODUCER,
          attributes: { "sb.conn": conns, "sb.edge": edgeId }
        }).span

    const onOutbound = (m: Bus.BusMessage) => {
      try {
        deliverOutbound(m)
      } catch (cause) {
        logCaught("edge: outbound message handler threw", cause, { subject: m.subject, op: m.header(Subjects.Header.op) ?? "" })
      }
    }

    const deliverOutbound = (m: Bus.BusMessage) => {
      const op = m.header(Subjects.Header.op)
      if (op === "deliver") {
        const one = m.header(Subjects.Header.conn)
        const span = deliverSpan(m.header(Subjects.Header.traceparent), one ?? m.header(Subjects.Header.conns) ?? "")
        if (one !== undefined) {
          const s = sockets.get(Subjects.ConnId(one))
          if (s) send(s, m.data)
          else if (streamable !== undefined && m.header(Subjects.Header.http) !== undefined) streamable.deliver(m)
        } else {
          for (const id of (m.header(Subjects.Header.conns) ?? "").split(",")) {
            const s = sockets.get(Subjects.ConnId(id))
            if (s) send(s, m.data)
          }
        }
        span?.end()
      } else if (op === "close") {
        const s = sockets.get(Subjects.ConnId(m.header(Subjects.Header.conn) ?? ""))
        if (s) closeSocket(s, Number(m.header(Subjects.Header.code) ?? CloseCode.Normal), m.header(Subjects.Header.reason) ?? "")
      } else if (op === "hold") {
        const s = sockets.get(Subjects.ConnId(m.header(Subjects.Header.conn) ?? ""))
        const token = m.header(Subjects.Header.handoff)
        if (s !== undefined && token !== undefined) hold(s, token)
      } else if (op === "release") {
        const s = held.get(Subjects.ConnId(m.header(Subjects.Header.conn) ?? ""))
        if (s !== undefined && s.held === m.header(Subjects.Header.handoff)) release(s)
      }
    }

    // --- hand-off: a connection's actor moves to another replica ------------------------------

    /** Held sockets, closed ones included: a socket that closes while held still gets released. */
    const held = new Map<Subjects.ConnId, Socket>()

    /**
     * Holds the connection's frames, and marks the end of what its current actor must handle: the
     * edge is the only publisher of a socket's frames, so everything sent before the marker
     * reaches that actor before it, in a NATS cluster too.
     */
    const hold = (s: Socket, token: string) => {
      if (s.holdTimer !== undefined) clearTimeout(s.holdTimer)
      s.held = token
      held.set(s.id, s)
      s.holdTimer = setTimeout(() => release(s), HOLD_LIMIT_MS)
      s.holdTimer.unref()
      try {
        bus.unsafePublish(s.subject, "", { [Subjects.Header.op]: "marker", [Subjects.Header.conn]: s.id, [Subjects.Header.handoff]: token })
      } catch {
        // The bus is gone: there is no hand-off to finish.
      }
    }

    /** The new actor listens: the held frames go to it, in order, then a close that happened meanwhile. */
    const release = (s: Socket) => {
      if (s.holdTimer !== undefined) clearTimeout(s.holdTimer)
      s.holdTimer = undefined
      s.held = undefined
      held.delete(s.id)
      if (s.state === "opening") return
      const pending = s.pending
      s.pending = []
      for (const [data, limited] of pending) forward(s, data, limited)
      if (s.state === "closed" && s.closedWith !== undefined) tellClosed(s, s.closedWith[0], s.closedWith[1])
    }

    // --- inbound: frames from sockets to their actor ---------------------------------------

    const forward = (s: Socket, data: Buffer, limited: boolean) => {
      let headers = limited ? s.limitedHeaders : s.frameHeaders
      let span: Span | undefined
      if (Option.isSome(tracer) && s.route.traceInbound) {
        const started = Telemetry.startSpan(tracer.value, "edge.receive", undefined, {
          kind: SpanKind.CONSUMER,
          attributes: { "sb.conn": s.id, "sb.edge": edgeId, "sb.path": s.path }
        })
        span = started.span
        headers = { ...headers, traceparent: started.traceparent }
      }
      const t0 = performance.now()
      try {
        bus.unsafePublish(s.subject, data, headers)
      } catch {
        closeSocket(s, CloseCode.InternalError, "bus unavailable")
      }
      metrics.observePublish((performance.now() - t0) / 1000)
      span?.end()
    }

    const onFrame = (s: Socket, data: Buffer, isBinary: boolean) => {
      if (isBinary) return closeSocket(s, CloseCode.Unsupported, "binary frames are not supported; send text")
      countFrame()
      metrics.framesIn++
      s.framesIn++
      metrics.bytesIn += data.byteLength
      const budget = s.budget.take()
      if (budget === "abusive") return closeSocket(s, CloseCode.PolicyViolation, "rate limit exceeded")
      const limited = budget === "limited"
      if (limited) metrics.rateLimited++
      if (s.state === "opening" || s.held !== undefined) {
        if (s.pending.length >= MAX_PENDING_FRAMES) {
          return closeSocket(s, CloseCode.TryAgainLater, s.held === undefined ? "too many frames before the session started" : "too many frames while the session moves")
        }
        s.pending.push([data, limited])
        return
      }
      if (s.state === "open") forward(s, data, limited)
    }

    // --- lifecycle -------------------------------------------------------------------------

    const tellClosed = (s: Socket, code: number, reason: string) => {
      try {
        bus.unsafePublish(s.subject, "", {
          [Subjects.Header.op]: "closed",
          [Subjects.Header.conn]: s.id,
          [Subjects.Header.edge]: edgeId,
          [Subjects.Header.code]: String(code),
          [Subjects.Header.reason]: reason
        })
      } catch {
        // The bus is gone; the service finds out through this edge's expired heartbeat.
      }
    }

    const closeSocket = (s: Socket, code: number, reason: string) => {
      if (s.ws.readyState === WebSocket.CLOSING || s.ws.readyState === WebSocket.CLOSED) return
      try {
        s.ws.close(code, fitCloseReason(reason))
        s.sentClose = [code, reason]
      } catch {
        // A code no close frame may carry (a service's bug: 1005, 999): the socket still closes.
        s.ws.close(CloseCode.InternalError, `invalid close code ${code}`)
        s.sentClose = [CloseCode.InternalError, `invalid close code ${code}`]
      }
      // A peer that does not read will never see the close frame; don't wait on it for long.
      s.closeTimer = setTimeout(() => s.ws.terminate(), Duration.toMillis(config.grace))
      s.closeTimer.unref()
    }

    const onClose = (s: Socket, code: number, reason: string) => {
      const wasOpen = s.state === "open"
      s.state = "closed"
      sockets.delete(s.id)
      // The timer would keep the socket, and all it holds, for the rest of the grace.
      if (s.closeTimer !== undefined) clearTimeout(s.closeTimer)
      // A close the edge began counts under the code it sent: a slow consumer it closed with 1013
      // and then terminated, for not reading the close frame either, is still a 1013, not a 1006.
      const [why, because] = s.sentClose ?? [code, reason]
      metrics.closed(s.path, why)
      runFork(
        Effect.logInfo(`edge: closed ${s.path} with ${why}${because === "" ? "" : `: ${because}`}`).pipe(
          Effect.annotateLogs({
            ...socketLog(s),
            user: s.user ?? "-",
            ms: Date.now() - s.openedAt,
            framesIn: s.framesIn,
            framesOut: s.framesOut
          })
        )
      )
      if (wasOpen && s.held === undefined) tellClosed(s, why, because)
      else s.closedWith = [why, because]
    }

    const startSession = (s: Socket, event: EdgeProtocol.OpenEvent) =>
      Actors.requestOpen(bus, s.route.service, s.id, edgeId, event, config.openTimeout).pipe(
        Effect.match({
          onFailure: (e) => {
            if (e._tag === "NoResponders") return closeSocket(s, CloseCode.TryAgainLater, `${s.route.service} service unavailable`)
            if (e._tag === "RequestTimeout") return closeSocket(s, CloseCode.TryAgainLater, `${s.route.service} service did not answer`)
            return closeSocket(s, CloseCode.InternalError, "could not start the session")
          },
          onSuccess: (reply) => {
            if (!reply.ok) return closeSocket(s, reply.code, reply.reason)
            if (s.closedWith !== undefined) return tellClosed(s, s.closedWith[0], s.closedWith[1])
            s.state = "open"
            // Held before the answer reached us: the frames wait for the hand-off's release.
            if (s.held !== undefined) return
            const pending = s.pending
            s.pending = []
            for (const [data, limited] of pending) forward(s, data, limited)
          }
        })
      )

    /** The frame limit of a path, and one ws server per limit (ws takes `maxPayload` per server). */
    const limitOf = (path: string) => config.maxPayloadByPath.get(path) ?? config.maxPayload
    const servers = new Map<number, WebSocketServer>()
    const serverFor = (limit: number) => {
      let wss = servers.get(limit)
      if (wss === undefined) {
        wss = new WebSocketServer({
          noServer: true,
          maxPayload: limit,
          perMessageDeflate: false,
          clientTracking: false,
          handleProtocols: (offered, req) => {
            const target = targetOf(req)
            const route = target === undefined ? undefined : routes[target.pathname]
            return route?.subprotocol !== undefined && offered.has(route.subprotocol) ? route.subprotocol : false
          }
        })
        servers.set(limit, wss)
      }
      return wss
    }

    const accept = (req: Http.IncomingMessage, socket: Duplex, head: Buffer, url: URL, route: Route, claims: Auth.Claims | undefined) =>
      serverFor(limitOf(url.pathname)).handleUpgrade(req, socket, head, (ws) => {
        try {
          openSocket(req, socket, ws, url, route, claims)
        } catch (cause) {
          // Past the handshake: the peer reads WebSocket frames now, not an HTTP error.
          logCaught("edge: opening a socket threw", cause, requestLog(req))
          ws.terminate()
        }
      })

    const openSocket = (req: Http.IncomingMessage, socket: Duplex, ws: WebSocket, url: URL, route: Route, claims: Auth.Claims | undefined) => {
      const id = Subjects.ConnId(randomUUID())
      const base = {
        [Subjects.Header.op]: "frame",
        [Subjects.Header.conn]: id,
        [Subjects.Header.edge]: edgeId,
        ...(claims === undefined ? {} : { [Subjects.Header.user]: claims.sub })
      }
      const s: Socket = {
        id,
        ws,
        remote: req.socket.remoteAddress ?? "unknown",
        raw: socket,
        corked: false,
        path: url.pathname,
        route,
        subject: Subjects.conn(route.service, id),
        frameHeaders: base,
        limitedHeaders: { ...base, [Subjects.Header.reason]: "rate-limited" },
        budget: new RateBudget(config.rate, config.burst),
        state: "opening",
        pending: [],
        held: undefined,
        holdTimer: undefined,
        closedWith: undefined,
        alive: true,
        sentClose: undefined,
        closeTimer: undefined,
        openedAt: Date.now(),
        user: claims?.sub,
        framesIn: 0,
        framesOut: 0
      }
      sockets.set(id, s)
      runFork(Effect.logInfo(`edge: opened ${s.path} with 101`).pipe(Effect.annotateLogs({ ...socketLog(s), user: s.user ?? "-" })))
      ws.on("close", (code, reason) => {
        try {
          onClose(s, code, reason.toString())
        } catch (cause) {
          logCaught("edge: socket close handler threw", cause, socketLog(s))
        }
      })
      metrics.opened(s.path)
      // One try per event, no Effect: this runs once per frame.
      ws.on("message", (data: Buffer, isBinary) => {
        try {
          onFrame(s, data, isBinary)
        } catch (cause) {
          socketFailed(s, "message", cause)
        }
      })
      ws.on("pong", () => {
        s.alive = true
      })
      ws.on("error", (e: Error & { readonly code?: string }) => {
        // ws closes the socket itself (1002/1007/1009) and emits `close` after this; the close
        // frame it sent says why, so the service and the log do too.
        if (s.sentClose !== undefined) return
        s.sentClose = e.code === "WS_ERR_UNSUPPORTED_MESSAGE_LENGTH"
          ? [CloseCode.TooBig, `frame too large (over ${limitOf(s.path)} bytes)`]
          : e.code === "WS_ERR_INVALID_UTF8"
          ? [1007, "invalid UTF-8 in a text frame"]
          : [CloseCode.ProtocolError, e.message]
      })
      const query: Record<string, string> = {}
      for (const [k, v] of url.searchParams) if (k !== "token") query[k] = v
      const origin = req.headers.origin
      const event: EdgeProtocol.OpenEvent = {
        path: url.pathname,
        query,
        openedAt: Date.now(),
        ...(origin === undefined ? {} : { origin }),
        ...(ws.protocol === "" ? {} : { protocol: ws.protocol }),
        ...(claims === undefined ? {} : { claims })
      }
      runFork(startSession(s, event))
    }

    const socketLog = (s: Socket) => ({ conn: s.id, path: s.path, remote: s.remote })

    /** An upgrade answered with an HTTP error, in the access log as the upgrades it refuses are. */
    const refuse = (req: Http.IncomingMessage, socket: Duplex, status: number, message: string) => {
      runFork(Effect.logInfo(`edge: refused an upgrade with ${status}: ${message}`).pipe(Effect.annotateLogs(requestLog(req))))
      refuseUpgrade(socket, status, message)
    }

    /** A socket whose handler threw: closed 1011, or cut if even that fails. */
    const socketFailed = (s: Socket, event: string, cause: unknown) => {
      logCaught(`edge: socket ${event} handler threw`, cause, socketLog(s))
      try {
        closeSocket(s, CloseCode.InternalError, "internal error")
      } catch {
        s.ws.terminate()
      }
    }

    /**
     * Takes the user's slot once the token is verified, and upgrades. The peer may have gone while
     * the token was checked: a destroyed socket never emits `close` again, and its slot would stay.
     */
    const acceptVerified = (req: Http.IncomingMessage, socket: Duplex, head: Buffer, url: URL, route: Route, claims: Auth.Claims) => {
      if (socket.destroyed) return
      if (shuttingDown) return refuse(req, socket, 503, "shutting down")
      const release = byUser.take(claims.sub)
      if (release === undefined) {
        return refuse(req, socket, 429, `too many connections for user ${claims.sub} (at most ${config.perUser})`)
      }
      socket.once("close", release)
      accept(req, socket, head, url, route, claims)
    }

    const upgrade = (req: Http.IncomingMessage, socket: Duplex, head: Buffer) => {
      if (shuttingDown) return refuse(req, socket, 503, "shutting down")
      const url = targetOf(req)
      if (url === undefined) return refuse(req, socket, 400, "malformed request target")
      const route = routes[url.pathname]
      if (route === undefined) return refuse(req, socket, 404, `no WebSocket endpoint at ${url.pathname}`)
      const origin = req.headers.origin
      if (!anyOrigin && origin !== undefined && !config.origins.includes(origin)) {
        return refuse(req, socket, 403, `origin ${origin} is not allowed`)
      }
      // The slot is the TCP socket's, from here to its close, whatever happens in between (a
      // refused token, a handshake ws rejects, a socket that lives for days).
      const address = req.socket.remoteAddress ?? "unknown"
      const release = byAddress.take(address)
      if (release === undefined) {
        return refuse(req, socket, 429, `too many connections from ${address} (at most ${config.perAddress})`)
      }
      socket.once("close", release)
      const token = bearer(req, url)
      if (token === undefined) {
        if (route.auth === "upgrade") return refuse(req, socket, 401, "a bearer token is required (Authorization header or ?token=)")
        return accept(req, socket, head, url, route, undefined)
      }
      runFork(
        auth.verify(token).pipe(
          Effect.either,
          Effect.flatMap((verdict) =>
            Effect.sync(() =>
              Either.match(verdict, {
                onLeft: (e) =>
                  refuse(req, socket, e._tag === "AuthFailed" ? 401 : 503, e._tag === "AuthFailed" ? `invalid token: ${e.reason}` : e.reason),
                onRight: (claims) => acceptVerified(req, socket, head, url, route, claims)
              })
            )
          ),
          Effect.catchAllCause((cause) =>
            Effect.sync(() => {
              logCaught("edge: upgrade failed after the token check", Cause.squash(cause), requestLog(req))
              refuse(req, socket, 500, "internal error")
            })
          )
        )
      )
    }

    const onUpgrade = (req: Http.IncomingMessage, socket: Duplex, head: Buffer) => {
      socket.on("error", () => socket.destroy())
      try {
        upgrade(req, socket, head)
      } catch (cause) {
        logCaught("edge: upgrade handler threw", cause, requestLog(req))
        // `openSocket` catches its own: what reaches here threw before the handshake, so the peer still reads HTTP.
        refuse(req, socket, 500, "internal error")
      }
    }

    /** Hands a plain HTTP request to the service that answers its path, over the bus. */
    const forwardHttp = (
      req: Http.IncomingMessage,
      url: URL,
      service: Subjects.ServiceName,
      reply: (status: number, body: string, type?: string) => void
    ) => {
      const chunks: Array<Buffer> = []
      let size = 0
      req.on("data", (chunk: Buffer) => {
        size += chunk.byteLength
        if (size > MAX_HTTP_BODY) {
          reply(413, "request body too large\n")
          req.destroy()
        } else chunks.push(chunk)
      })
      req.on("end", () => {
        guarded(req, reply, () => {
          const request: EdgeProtocol.HttpRequest = {
            method: req.method ?? "GET",
            path: url.pathname,
            query: Object.fromEntries(url.searchParams),
            body: Buffer.concat(chunks).toString("utf8"),
            ...(req.headers.authorization === undefined ? {} : { authorization: req.headers.authorization })
          }
          runFork(
            bus.request(Subjects.http(service), encodeHttpRequest(request), { timeout: "10 seconds" }).pipe(
              Effect.flatMap((m) => decodeHttpResponse(Bus.text(m))),
              Effect.match({
                onFailure: (e) =>
                  e._tag === "NoResponders"
                    ? reply(503, `${service} service unavailable\n`)
                    : e._tag === "RequestTimeout"
                    ? reply(504, `${service} service did not answer\n`)
                    : reply(502, "bad answer from the service\n"),
                onSuccess: (r) => reply(r.status, JSON.stringify(r.body), "application/json")
              }),
              // An answer that cannot be written (a status Node refuses, say) is the service's bug;
              // the client still gets an answer.
              Effect.catchAllCause((cause) =>
                Effect.sync(() => requestFailed(req, reply, "edge: answering a forwarded request failed", Cause.squash(cause)))
              )
            )
          )
        })
      })
    }

    /** Logs the request a bug hit, and answers it 500 (or cuts a response already begun). */
    const requestFailed = (req: Http.IncomingMessage, reply: (status: number, body: string) => void, what: string, cause: unknown) => {
      logCaught(what, cause, requestLog(req))
      try {
        reply(500, "internal error\n")
      } catch {
        req.socket.destroy()
      }
    }

    const guarded = (req: Http.IncomingMessage, reply: (status: number, body: string) => void, handle: () => void) => {
      try {
        handle()
      } catch (cause) {
        requestFailed(req, reply, "edge: request handler threw", cause)
      }
    }

    const onRequest = (req: Http.IncomingMessage, res: Http.ServerResponse) => {
      const reply = (status: number, body: string, type = "text/plain; charset=utf-8") => {
        if (res.headersSent) return void res.destroy()
        res.writeHead(status, { "content-type": type, "content-length": Buffer.byteLength(body) })
        res.end(body)
      }
      guarded(req, reply, () => {
        const url = targetOf(req)
        if (url === undefined) return reply(400, "malformed request target\n")
        const path = url.pathname
        if (req.method === "GET" && path === "/healthz") return reply(200, "ok\n")
        if (req.method === "GET" && path === "/readyz") {
          if (shuttingDown) return reply(503, "shutting down\n")
          if (!bus.isConnected()) return reply(503, "bus disconnected\n")
          return void runFork(Effect.map(absentServices, (absent) => {
            if (absent.length === 0) return reply(200, "ready\n")
            const what = `no live replica of ${absent.join(", ")}`
            return absent.length === served.length ? reply(503, `not ready: ${what}, so every upgrade would be refused\n`) : reply(200, `ready, but ${what}\n`)
          }))
        }
        if (req.method === "GET" && path === "/metrics") return reply(200, metrics.render(), "text/plain; version=0.0.4")
        const routed = httpRoutes.find(([prefix]) => path.startsWith(prefix))
        if (routed !== undefined) return forwardHttp(req, url, routed[1], reply)
        if (streamable?.serves(path) === true) return streamable.handle(req, res, url)
        if (embed.serves(path)) return embed.handle(req, res, path)
        if (routes[path] !== undefined) return reply(426, "this endpoint speaks WebSocket\n")
        reply(404, "not found\n")
      })
    }

    // --- readiness: an edge none of whose services runs would refuse every upgrade -----------

    const served = [...new Set(Object.values(routes).map((r) => r.service))]
    const replicas = yield* kv.bucket(Subjects.Bucket.replicas)
    /** Probes come every few seconds from each kubelet: one look at the replica keys per second is plenty. */
    let lastLook: { readonly at: number; readonly absent: ReadonlyArray<Subjects.ServiceName> } | undefined
    const absentServices = Effect.suspend(() =>
      lastLook !== undefined && Date.now() - lastLook.at < 1000
        ? Effect.succeed(lastLook.absent)
        : Effect.filter(served, (service) =>
          Effect.map(replicas.keys(Subjects.Key.replicas(service)), (keys) => keys.length === 0).pipe(Effect.orElseSucceed(() => true))
        ).pipe(Effect.tap((absent) => Effect.sync(() => (lastLook = { at: Date.now(), absent }))))
    )

    // --- resources, in the order they must be released --------------------------------------

    yield* bus.subscribe(Subjects.edgeOut(edgeId), onOutbound)

    const edges = yield* kv.bucket(Subjects.Bucket.edges)
    const startedAt = Date.now()
    // Suspended, so each beat reports the sockets open at that moment, not at the first.
    yield* Effect.suspend(() => edges.put(Subjects.Key.edge(edgeId), encodeHeartbeat({ startedAt, connections: sockets.size }))).pipe(
      Effect.zipRight(Effect.void),
      Effect.catchAll((e) => Effect.logWarning("edge heartbeat failed", e)),
      Effect.repeat(Schedule.spaced(config.heartbeat)),
      Effect.forkScoped
    )

    const server = yield* Effect.acquireRelease(
      Effect.async<Http.Server, Settings.StartupFailure>((resume) => {
        const headersTimeout = Duration.toMillis(config.headersTimeout)
        const server = Http.createServer({
          // A peer that sends its headers (an upgrade's too) or its body a byte at a time must
          // not hold a socket for long; Node looks for such peers every checking interval.
          headersTimeout,
          requestTimeout: Duration.toMillis(config.requestTimeout),
          connectionsCheckingInterval: Math.max(100, Math.min(1000, headersTimeout / 2))
        }, onRequest)
        server.on("upgrade", onUpgrade)
        server.once("error", (e) => resume(Effect.fail(Settings.listenFailure(e, config.host, config.port))))
        server.listen(config.port, config.host, () => {
          // Once listening, an error (accept failing for want of file descriptors, say) is logged; the edge carries on.
          server.on("error", (e) => logCaught("edge: server error", e, {}))
          resume(Effect.succeed(server))
        })
      }),
      (server) =>
        Effect.gen(function*() {
          shuttingDown = true
          const open = [...sockets.values()]
          yield* Effect.logInfo(`edge ${edgeId} shutting down: closing ${open.length} sockets with 1001`)
          yield* Effect.async<void>((resume) => {
            if (open.length === 0) return resume(Effect.void)
            let left = open.length
            for (const s of open) {
              s.ws.once("close", () => --left === 0 && resume(Effect.void))
              closeSocket(s, CloseCode.GoingAway, "server shutting down")
            }
          }).pipe(Effect.timeout(Duration.sum(config.grace, "1 second")), Effect.ignore)
          yield* Effect.async<void>((resume) => {
            server.close(() => resume(Effect.void))
            server.closeAllConnections()
          })
          yield* edges.delete(Subjects.Key.edge(edgeId)).pipe(Effect.ignore)
        })
    )

    const ping = setInterval(() => {
      for (const s of sockets.values()) {
        try {
          if (!s.alive) {
            s.ws.terminate()
            continue
          }
          s.alive = false
          s.ws.ping()
        } catch (cause) {
          socketFailed(s, "ping", cause)
        }
      }
    }, Duration.toMillis(config.pingInterval))
    yield* Effect.addFinalizer(() => Effect.sync(() => clearInterval(ping)))

    const address = server.address()
    const port = typeof address === "object" && address !== null ? address.port : config.port
    const url = `http://${config.host}:${port}`
    yield* Effect.logInfo(`edge ${edgeId} listening on ${url} (${Object.keys(routes).join(", ")})`)
    return { id: edgeId, port, url, metrics, connections: () => sockets.size } satisfies EdgeServerShape
  })

export const layer = (
  options: EdgeOptions = {}
): Layer.Layer<EdgeServer, Bus.BusError | ConfigError.ConfigError | Settings.StartupFailure, Bus.Bus | Kv.Kv | AuthClient.AuthClient | Telemetry.Tracing> =>
  Layer.scoped(EdgeServer, make(options))
