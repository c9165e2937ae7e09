/**
 * The edge's socket I/O: frames from an accepted WebSocket to its actor over the bus, and the
 * bus's deliveries back to the socket; holds and markers while an actor moves, ping/pong, slow
 * consumers and the close. Plain callbacks on purpose: this runs once per frame, and an Effect per
 * frame would cost more than the relay itself.
 */
import { Actors, Bus, type Peer, RateBudget, Subjects, TimedMap } from "@switchboard/bus"
import { type Auth, Edge as EdgeProtocol, Envelope, type Host } from "@switchboard/protocol"
import { Telemetry } from "@switchboard/telemetry"
import { type Span, SpanKind } from "@opentelemetry/api"
import * as Duration from "effect/Duration"
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import type * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import type * as Http from "node:http"
import type { Duplex } from "node:stream"
import type { Boundary } from "./Boundary.ts"
import {
  closeSocket as closeWith,
  type EdgeSocket as Socket,
  type EdgeWebSocket,
  frameOf,
  MAX_PENDING_FRAMES,
  type SocketEvents,
  socketLog
} from "./EdgeSocket.ts"
import type { EdgeMetrics } from "./Metrics.ts"
import type { ToSockets } from "./Outbound.ts"
import type { SocketTarget } from "./Requests.ts"
import type { Route } from "./Routes.ts"
import * as SocketHolds from "./SocketHolds.ts"
import * as SocketWrites from "./SocketWrites.ts"
import type { Turn } from "./Turn.ts"

export { fitCloseReason, MAX_PENDING_FRAMES } from "./EdgeSocket.ts"

const CloseCode = EdgeProtocol.CloseCode

/** How many times `openTimeout` the edge still waits for a late answer to an open, to end its actor. */
const LATE_ANSWERS = 3

export interface SocketsOptions {
  readonly edgeId: Subjects.EdgeId
  readonly boundary: Boundary
  readonly turn: Turn
  readonly metrics: EdgeMetrics
  /** The frame limit of a path, named in the close that a larger frame gets. */
  readonly limitOf: (path: string) => number
  /** Bytes a socket may have waiting to be written before it is closed 1013 as a slow consumer. */
  readonly outboundHighWaterMark: number
  /** Frames per second, and burst, before frames are marked rate-limited (twice over: closed 1008). */
  readonly rate: number
  readonly burst: number
  readonly openTimeout: Duration.DurationInput
  /** How long a peer has to answer the edge's close before it is terminated. */
  readonly closeGrace: Duration.DurationInput
  readonly pingInterval: Duration.DurationInput
}

export interface Sockets {
  /** Takes a socket past its handshake: it asks the route's service to host its actor, and relays from then on. */
  readonly open: (
    req: Http.IncomingMessage,
    raw: Duplex,
    ws: EdgeWebSocket,
    target: SocketTarget,
    route: Route,
    claims: Auth.Claims | undefined
  ) => void
  /** Takes a message from this edge's outbound subject (see `Outbound.ts`): a delivery, a close, a hold or a release. */
  readonly outbound: (out: ToSockets, data: Uint8Array) => void
  /** Sockets open now (the heartbeat's count). */
  readonly size: () => number
  /**
   * Closes every socket with `code` and `reason`, and waits for their closes for at most the grace
   * and a second; `doing` says why in the log ("shutting down").
   */
  readonly closeAll: (doing: string, code: number, reason: string) => Effect.Effect<void>
}

/** The socket I/O, pinging its sockets until the scope closes; `Outbound.ts` hands it what services send them. */
export const make = (options: SocketsOptions): Effect.Effect<Sockets, Bus.BusError, Bus.Bus | Telemetry.Tracing | Scope.Scope> =>
  Effect.gen(function*() {
    const bus = yield* Bus.Bus
    const { tracer } = yield* Telemetry.Tracing
    const { edgeId, metrics, turn, limitOf } = options
    const { runFork, logCaught, debugLogged } = options.boundary
    const grace = Duration.toMillis(options.closeGrace)
    const sockets = new Map<Subjects.ConnId, Socket>()

    const closeSocket = (s: Socket, code: number, reason: string) => closeWith(s, code, reason, grace)
    const send = SocketWrites.make({ turn, metrics, outboundHighWaterMark: options.outboundHighWaterMark, close: closeSocket })

    /** The frames that waited (for the session to start, or for a hand-off) go on, in order. */
    const flush = (s: Socket) => {
      const pending = s.pending
      s.pending = []
      for (const [data, limited] of pending) forward(s, data, limited)
    }
    const holds = SocketHolds.make({ bus, flush, tellClosed: (s, code, reason) => tellClosed(s, code, reason) })

    /** What services send to this edge's sockets; a delivery to a socket that is gone is dropped. */
    const outbound = (out: ToSockets, data: Uint8Array) => {
      switch (out._tag) {
        case "Deliver": {
          const s = sockets.get(Subjects.ConnId(out.conn))
          if (s !== undefined) send(s, data)
          return
        }
        case "Fanout":
          for (const id of out.conns) {
            const s = sockets.get(Subjects.ConnId(id))
            if (s !== undefined) send(s, data)
          }
          return
        case "Close": {
          const s = sockets.get(Subjects.ConnId(out.conn))
          if (s !== undefined) closeSocket(s, out.code, out.reason)
          return
        }
        case "Hold": {
          const s = sockets.get(Subjects.ConnId(out.conn))
          if (s !== undefined) holds.hold(s, out.handoff)
          return
        }
        case "Release":
          return holds.release(Subjects.ConnId(out.conn), out.handoff)
      }
    }

    // --- inbound: frames from sockets to their actor ---------------------------------------

    const forward = (s: Socket, data: Buffer, limited: boolean) => {
      let headers = limited ? (s.limitedHeaders ??= Envelope.encodeEdgeIn(frameOf(s.id, edgeId, s.user, true))) : s.frameHeaders
      let span: Span | undefined
      if (Option.isSome(tracer) && s.route.traceInbound) {
        const started = Telemetry.startSpan(tracer.value, "edge.receive", undefined, {
          kind: SpanKind.CONSUMER,
          attributes: { "sb.conn": s.id, "sb.edge": edgeId, "sb.path": s.path }
        })
        span = started.span
        headers = Envelope.encodeEdgeIn(frameOf(s.id, edgeId, s.user, limited, started.traceparent))
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
      turn.count()
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
        bus.unsafePublish(s.subject, "", Envelope.encodeEdgeIn({ _tag: "Closed", conn: s.id, edge: edgeId, code, reason }))
      } catch {
        // The bus is gone; the service finds out through this edge's expired heartbeat.
      }
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

    /** A socket whose handler threw: closed 1011, or cut if even that fails. */
    const socketFailed = (s: Socket, event: string, cause: unknown) => {
      logCaught(`edge: socket ${event} handler threw`, cause, socketLog(s))
      try {
        closeSocket(s, CloseCode.InternalError, "internal error")
      } catch {
        s.ws.terminate()
      }
    }

    // --- the socket's events ------------------------------------------------------------------
    // One set of handlers for every socket, which its ws (`EdgeWebSocket`) calls with it: no
    // closure, listener or map entry per socket (issue 29). One try per event, no Effect: this
    // runs once per frame.

    const events: SocketEvents = {
      close: (s, code, reason) => {
        try {
          onClose(s, code, reason.toString())
        } catch (cause) {
          logCaught("edge: socket close handler threw", cause, socketLog(s))
        }
      },
      message: (s, data, isBinary) => {
        try {
          onFrame(s, data, isBinary)
        } catch (cause) {
          socketFailed(s, "message", cause)
        }
      },
      pong: (s) => {
        s.alive = true
      },
      error: (s, e) => {
        // ws closes the socket itself (1002/1007/1009) and emits `close` after this; the close
        // frame it sent says why, so the service and the log do too.
        if (s.sentClose !== undefined) return
        s.sentClose = e.code === "WS_ERR_UNSUPPORTED_MESSAGE_LENGTH"
          ? [CloseCode.TooBig, `frame too large (over ${limitOf(s.path)} bytes)`]
          : e.code === "WS_ERR_INVALID_UTF8"
          ? [1007, "invalid UTF-8 in a text frame"]
          : [CloseCode.ProtocolError, e.message]
      }
    }

    /** How long a socket waits for its service; the answer itself is awaited `LATE_ANSWERS` times as long. */
    const openMillis = Duration.toMillis(Duration.decode(options.openTimeout))
    const answerTimeout = Duration.millis(openMillis * LATE_ANSWERS)
    /** Sockets waiting for their service: one timer for all, where one per socket outlived the young generation. */
    const opening = yield* TimedMap.make<Subjects.ConnId, Socket>(openMillis, (_id, s) => {
      try {
        if (s.state === "opening") giveUp(s, `${s.route.service} service did not answer`)
      } catch (cause) {
        socketFailed(s, "open", cause)
      }
    })

    /**
     * The socket waits `openTimeout` for its service and is then closed 1013. The answer is still
     * awaited a while: a replica that made the actor late (or whose answer was lost) is told
     * "closed" once it answers, so that actor ends instead of living on for a socket that is gone.
     * A callback, not a fiber: a fiber per socket waiting for its service outlived a scavenge and
     * was old-generation garbage of every handshake (issue 29).
     */
    const startSession = (s: Socket, event: EdgeProtocol.OpenEvent) => {
      opening.set(s.id, s)
      Actors.unsafeRequestOpen(bus, s.route.service, s.id, edgeId, event, answerTimeout, (exit) => {
        opening.delete(s.id)
        try {
          opened(s, exit)
        } catch (cause) {
          socketFailed(s, "open", cause)
        }
      })
    }

    const giveUp = (s: Socket, reason: string) => {
      closeSocket(s, CloseCode.TryAgainLater, reason)
      tellClosed(s, CloseCode.TryAgainLater, reason)
    }

    /** The service's answer to a socket's open. */
    const opened = (s: Socket, exit: Exit.Exit<void, Host.OpenRefused | Peer.PeerTimeout | Peer.PeerUnavailable>) => {
      if (Exit.isSuccess(exit)) {
        if (s.closedWith !== undefined) return tellClosed(s, s.closedWith[0], s.closedWith[1])
        s.state = "open"
        // Held before the answer reached us: the frames wait for the hand-off's release.
        if (s.held === undefined) flush(s)
        return
      }
      const failure = Cause.failureOption(exit.cause)
      const e = Option.isSome(failure) ? failure.value : undefined
      if (e?._tag === "OpenRefused") return closeSocket(s, e.code, e.reason)
      if (e?._tag === "PeerUnavailable" && e.reason === "NoResponders") return closeSocket(s, CloseCode.TryAgainLater, `${s.route.service} service unavailable`)
      if (e?._tag === "PeerTimeout") return giveUp(s, `${s.route.service} service did not answer`)
      // An answer that says the service died: the fiber that awaited it died too, and left the
      // socket opening for good. Logged, and closed as any failed start.
      if (e === undefined) logCaught("edge: the service failed to open a socket", Cause.squash(exit.cause), socketLog(s))
      closeSocket(s, CloseCode.InternalError, "could not start the session")
      tellClosed(s, CloseCode.InternalError, "could not start the session")
    }

    const open: Sockets["open"] = (req, raw, ws, { path, query }, route, claims) => {
      const id = Subjects.ConnId(randomUUID())
      const s: Socket = {
        id,
        ws,
        remote: req.socket.remoteAddress ?? "unknown",
        raw,
        corked: false,
        path,
        route,
        subject: Subjects.conn(route.service, id),
        frameHeaders: Envelope.encodeEdgeIn(frameOf(id, edgeId, claims?.sub, false)),
        limitedHeaders: undefined,
        budget: new RateBudget(options.rate, options.burst),
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
      if (debugLogged) runFork(Effect.logDebug(`edge: opened ${s.path} with 101`).pipe(Effect.annotateLogs({ ...socketLog(s), user: s.user ?? "-" })))
      ws.take(s, events)
      metrics.opened(s.path)
      // Built field by field: no temporary object per optional field, as a spread makes.
      const event: { -readonly [K in keyof EdgeProtocol.OpenEvent]: EdgeProtocol.OpenEvent[K] } = { path, query, openedAt: Date.now() }
      const origin = req.headers.origin
      if (origin !== undefined) event.origin = origin
      if (ws.protocol !== "") event.protocol = ws.protocol
      if (claims !== undefined) event.claims = claims
      startSession(s, event)
    }

    const closeAll = (doing: string, code: number, reason: string) => Effect.suspend(() => {
      const open = [...sockets.values()]
      return Effect.logInfo(`edge ${edgeId} ${doing}: closing ${open.length} sockets with ${code}`).pipe(
        Effect.zipRight(
          Effect.async<void>((resume) => {
            if (open.length === 0) return resume(Effect.void)
            let left = open.length
            for (const s of open) {
              s.ws.once("close", () => --left === 0 && resume(Effect.void))
              closeSocket(s, code, reason)
            }
          }).pipe(Effect.timeout(Duration.sum(options.closeGrace, "1 second")), Effect.ignore)
        )
      )
    })

    // A socket that has not answered the last ping by the next is gone, whatever TCP thinks.
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
    }, Duration.toMillis(options.pingInterval))
    yield* Effect.addFinalizer(() => Effect.sync(() => clearInterval(ping)))

    return { open, outbound, size: () => sockets.size, closeAll } satisfies Sockets
  })
