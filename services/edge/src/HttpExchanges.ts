/**
 * Streamable HTTP responses that wait for their client: a POST held until its answer (JSON for a
 * lone answer, SSE once something comes first) and a GET's event stream. This module writes them,
 * bounds what waits in them, and tells its caller when one is lost; who the messages are for (a
 * session, a request of a sessionless era) is the caller's, named here only by an opaque key.
 */
import { Bus } from "@switchboard/bus"
import { JsonRpc } from "@switchboard/protocol"
import { Telemetry } from "@switchboard/telemetry"
import { SpanKind } from "@opentelemetry/api"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type * as ConfigError from "effect/ConfigError"
import type * as Scope from "effect/Scope"
import type * as Http from "node:http"
import * as EdgeConfig from "./Config.ts"
import { fail, failureBody } from "./HttpChecks.ts"
import type { EdgeMetrics } from "./Metrics.ts"

/** An exchange open on this edge; what its deliveries name it by (the envelope's `http`, `sb-http` on the bus). */
export type ExchangeId = string

/** What an exchange's caller hears when its response is lost before its answer (or, for a stream, its end). */
export interface Losses {
  /**
   * The edge cut the response: its client stopped reading (EDGE_OUTBOUND_HWM, EDGE_HTTP_WRITE_STALL).
   * The answer can no longer reach anyone; the request should be cancelled.
   */
  readonly onCut?: ((exchange: ExchangeId, reason: string) => void) | undefined
  /** The client closed the response itself (for MCP 2026-07-28, that cancels the request). */
  readonly onClosed?: ((exchange: ExchangeId) => void) | undefined
}

export interface Exchange extends Losses {
  readonly res: Http.ServerResponse
  /** Whom the exchange serves, for logs and spans only (a session id). */
  readonly key: string
  readonly user: string
  /** Headers every 200 of this exchange carries (`Mcp-Session-Id`). */
  readonly headers?: Readonly<Record<string, string>> | undefined
  /** Fields for the warning a cut logs (`session`, `request`). */
  readonly about?: Readonly<Record<string, string>> | undefined
}

/** A POST's request, waiting for its answer. */
export interface PostExchange extends Exchange {
  /** The request's id: a 504 answers it. */
  readonly id: JsonRpc.Id
}

/** A GET's event stream; its 200 waits for the first delivery, which acknowledges it (a 504 if none comes in time). */
export interface StreamExchange extends Exchange {
  /**
   * The client takes an event with an id and empty data (MCP 2025-11-25 on), so the stream opens
   * with one: a client cut before the first event then resumes from it, missing nothing.
   */
  readonly primes: boolean
}

/** One message for an exchange; empty data with `end` ends it with nothing more to say. */
export interface Delivery {
  readonly data: Uint8Array
  /** The answer (a POST), or the stream's last message. */
  readonly end: boolean
  /** An SSE event id (a GET stream's). */
  readonly eventId?: string | undefined
  /** The trace the answer belongs to: its delivery gets a span. */
  readonly traceparent?: string | undefined
  /** The answer's HTTP status when not 200 (a refusal), as the service gave it; a stream's answer is in a 200 already. */
  readonly status?: number | undefined
}

export interface HttpExchanges {
  /** Holds a POST's response until its answer; the id its deliveries name. */
  readonly post: (exchange: PostExchange) => ExchangeId
  /** Holds a GET's response as an event stream; the id its deliveries name. */
  readonly stream: (exchange: StreamExchange) => ExchangeId
  /** Writes to an open exchange; one that is gone (answered, closed, cut) takes nothing. */
  readonly deliver: (exchange: ExchangeId, delivery: Delivery) => void
  /** Ends every open GET stream, so that its client resumes from its `Last-Event-ID`; the number ended. */
  readonly endStreams: () => number
}

export interface HttpExchangesOptions {
  readonly edgeId: string
  readonly metrics: EdgeMetrics
  readonly runFork: <A, E>(effect: Effect.Effect<A, E>) => unknown
  readonly logCaught: (what: string, cause: unknown, about: Readonly<Record<string, string>>) => void
}

/**
 * A response and what waits in it for its client. A client that stops reading would have the edge
 * hold all that is written to it, so each is watched: a write that would take what waits over
 * EDGE_OUTBOUND_HWM cuts it, and so do bytes that have not moved for EDGE_HTTP_WRITE_STALL. Node
 * tells nothing of a write in progress, only of writes done: what has left is the bytes written
 * (`queued`) less what still waits.
 */
interface Outbound {
  /** Its key in `open` while it is open. */
  readonly n: ExchangeId
  readonly of: Exchange
  queued: number
  /** What had left at the last look that saw it move, and when; undefined while nothing waits. */
  left: number
  movedAt: number | undefined
}

/**
 * A POST whose request waits for its answer. It becomes an SSE stream when a notification comes
 * first. Its deadline is swept for, not a timer of its own: a timer and its clearing were a
 * measurable part of each modern tools/call (issue 28), and nearly every POST is answered in time.
 */
interface Pending extends Outbound {
  readonly kind: "post"
  readonly id: JsonRpc.Id
  /** When it is answered 504 (its SSE stream ended), as `Date.now()`; each delivery puts it off. */
  deadline: number
  sse: boolean
}

interface Stream extends Outbound {
  readonly kind: "stream"
  /** Until the acknowledgement; a 504 when it does not come. */
  timer: ReturnType<typeof setTimeout> | undefined
  readonly primes: boolean
}

const HTTP_SPAN = { "sb.transport": "http" } as const

/** One SSE event; a line break inside `data` would end the field, so each line gets its own. */
const sseEvent = (data: string, id: string | undefined) =>
  `${id === undefined ? "" : `id: ${id}\n`}data: ${data.includes("\n") ? data.split(/\r?\n/).join("\ndata: ") : data}\n\n`

/** Only a client error may replace the 200: a service names a refusal, never a redirect or a success of its own. */
const statusOf = ({ status }: Delivery) => (status !== undefined && status >= 400 && status < 500 ? status : 200)

const SSE_HEADERS = { "content-type": "text/event-stream", "cache-control": "no-cache, no-transform", connection: "keep-alive" } as const

export const make = (
  options: HttpExchangesOptions
): Effect.Effect<HttpExchanges, ConfigError.ConfigError, Telemetry.Tracing | Scope.Scope> =>
  Effect.gen(function*() {
    const { tracer } = yield* Telemetry.Tracing
    const config = {
      keepAlive: yield* EdgeConfig.httpKeepAlive,
      responseTimeout: Duration.toMillis(yield* EdgeConfig.httpResponseTimeout),
      hwm: yield* EdgeConfig.outboundHighWaterMark,
      writeStall: yield* EdgeConfig.httpWriteStall
    }
    const { runFork } = options
    const open = new Map<ExchangeId, Pending | Stream>()
    /** Responses ended with bytes still waiting: watched until they leave. */
    const draining = new Set<Pending | Stream>()
    let next = 0

    // Idle SSE streams get a comment now and then, or a proxy in between may cut them.
    const keepAlive = setInterval(() => {
      // A GET stream not acknowledged yet has no headers: a write would send a bare 200.
      for (const ex of open.values()) if (ex.kind === "stream" ? ex.timer === undefined : ex.sse) write(ex, ": keep-alive\n\n")
    }, Duration.toMillis(config.keepAlive))
    keepAlive.unref()
    yield* Effect.addFinalizer(() => Effect.sync(() => clearInterval(keepAlive)))

    const stallMillis = Duration.toMillis(config.writeStall)
    const stallText = Duration.format(config.writeStall)

    /** Writes to an open response; false when the write would take what waits over the bound, and the response was cut instead. */
    const write = (ex: Pending | Stream, chunk: string): boolean => {
      const res = ex.of.res
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
      if (ex.of.res.writableLength > 0 && !ex.of.res.destroyed) draining.add(ex)
    }

    /** Cuts a response whose client stopped reading; its caller hears of it if it was still unanswered. */
    const cut = (ex: Pending | Stream, why: "buffer" | "stall", waiting: number) => {
      const unanswered = open.get(ex.n) === ex
      open.delete(ex.n)
      draining.delete(ex)
      if (ex.kind === "stream") clearTimeout(ex.timer)
      const reason = why === "buffer"
        ? `slow consumer: more than ${config.hwm} bytes waiting (EDGE_OUTBOUND_HWM)`
        : `stalled: ${waiting} bytes waiting, unmoved for ${stallText} (EDGE_HTTP_WRITE_STALL)`
      options.metrics.httpCut(why)
      runFork(
        Effect.logWarning(`edge: cut a Streamable HTTP ${ex.kind === "post" ? "response" : "GET stream"}: ${reason}`).pipe(
          Effect.annotateLogs({ ...ex.of.about, user: ex.of.user, ...(ex.kind === "post" ? { answered: String(!unanswered) } : {}) })
        )
      )
      ex.of.res.destroy()
      if (!unanswered) return
      try {
        ex.of.onCut?.(ex.n, reason)
      } catch (cause) {
        options.logCaught("edge: telling of a cut Streamable HTTP response failed", cause, { ...ex.of.about })
      }
    }

    /** Whether what waits in `ex` has moved since the last look; a response stuck for the stall is cut. */
    const look = (ex: Pending | Stream, now: number) => {
      const waiting = ex.of.res.writableLength
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
        for (const ex of open.values()) if (!ex.of.res.destroyed) look(ex, now)
        for (const ex of draining) {
          if (ex.of.res.destroyed || ex.of.res.writableFinished) draining.delete(ex)
          else look(ex, now)
        }
      } catch (cause) {
        options.logCaught("edge: watching Streamable HTTP responses failed", cause, {})
      }
    }, Math.min(1000, Math.max(50, stallMillis / 4)))
    watch.unref()
    yield* Effect.addFinalizer(() => Effect.sync(() => clearInterval(watch)))

    /** The client closed a response still open (a stream the 504 of `timedOut` ended counts too). */
    const onClose = (ex: Pending | Stream) => () => {
      if (ex.kind === "stream") clearTimeout(ex.timer)
      if (open.get(ex.n) !== ex) return
      open.delete(ex.n)
      try {
        ex.of.onClosed?.(ex.n)
      } catch (cause) {
        options.logCaught("edge: telling of a closed Streamable HTTP response failed", cause, { ...ex.of.about })
      }
    }

    const timedOut = (n: ExchangeId) => {
      const ex = open.get(n)
      if (ex === undefined) return
      if (ex.kind === "stream") {
        // Its caller never acknowledged it: the client may try again, and the caller forgets it if it ever does.
        if (!ex.of.res.destroyed) fail(ex.of.res, 504, JsonRpc.ErrorCode.InternalError, "the session did not open the stream in time")
        return
      }
      open.delete(n)
      if (ex.sse) {
        ex.of.res.end()
        return ended(ex)
      }
      const body = failureBody(JsonRpc.ErrorCode.InternalError, "the session did not answer in time", ex.id)
      ex.of.res.writeHead(504, { "content-type": "application/json", "content-length": Buffer.byteLength(body) }).end(body)
    }

    // POSTs past their deadline, looked for a tenth of the timeout apart (at most a second, at least 10 ms).
    const deadlines = setInterval(() => {
      try {
        const now = Date.now()
        for (const ex of open.values()) if (ex.kind === "post" && ex.deadline <= now) timedOut(ex.n)
      } catch (cause) {
        options.logCaught("edge: timing out Streamable HTTP requests failed", cause, {})
      }
    }, Math.min(1000, Math.max(10, config.responseTimeout / 10)))
    deadlines.unref()
    yield* Effect.addFinalizer(() => Effect.sync(() => clearInterval(deadlines)))

    const post = (exchange: PostExchange): ExchangeId => {
      const n = String(++next)
      const deadline = Date.now() + config.responseTimeout
      const pending: Pending = { kind: "post", n, of: exchange, id: exchange.id, deadline, sse: false, queued: 0, left: 0, movedAt: undefined }
      open.set(n, pending)
      // `on`, not `once`: a response closes once, and once's wrapper was one more object per POST.
      exchange.res.on("close", onClose(pending))
      return n
    }

    const stream = (exchange: StreamExchange): ExchangeId => {
      const n = String(++next)
      const s: Stream = {
        kind: "stream",
        n,
        of: exchange,
        queued: 0,
        left: 0,
        movedAt: undefined,
        timer: setTimeout(() => timedOut(n), config.responseTimeout),
        primes: exchange.primes
      }
      open.set(n, s)
      exchange.res.once("close", onClose(s))
      return n
    }

    const deliverToStream = (ex: Stream, d: Delivery) => {
      if (ex.timer !== undefined) {
        clearTimeout(ex.timer)
        ex.timer = undefined
        ex.of.res.writeHead(200, { ...SSE_HEADERS, ...ex.of.headers })
        if (ex.primes && d.eventId !== undefined) write(ex, `id: ${d.eventId}\ndata: \n\n`)
        else ex.of.res.flushHeaders()
      }
      if (d.data.byteLength > 0 && !write(ex, sseEvent(Bus.text(d), d.eventId))) return
      if (d.end) {
        open.delete(ex.n)
        ex.of.res.end()
        ended(ex)
      }
    }

    const deliver = (n: ExchangeId, d: Delivery) => {
      const ex = open.get(n)
      if (ex === undefined) return
      if (ex.kind === "stream") return deliverToStream(ex, d)
      ex.deadline = Date.now() + config.responseTimeout
      if (d.end && d.traceparent !== undefined && Option.isSome(tracer)) {
        Telemetry.startSpan(tracer.value, "edge.deliver", d.traceparent, {
          kind: SpanKind.PRODUCER,
          attributes: { ...HTTP_SPAN, "sb.conn": ex.of.key, "sb.edge": options.edgeId }
        }).span.end()
      }
      const res = ex.of.res
      if (!ex.sse) {
        if (d.end) {
          open.delete(n)
          // A request cancelled by the client ends with nothing to say.
          if (d.data.byteLength === 0) return void res.writeHead(202).end()
          res.writeHead(statusOf(d), { "content-type": "application/json", "content-length": d.data.byteLength, ...ex.of.headers }).end(d.data)
          return ended(ex)
        }
        // A notification before the answer: the response becomes a stream (the POST accepted one).
        ex.sse = true
        res.writeHead(200, { ...SSE_HEADERS, ...ex.of.headers })
      }
      if (d.data.byteLength > 0 && !write(ex, sseEvent(Bus.text(d), undefined))) return
      if (d.end) {
        open.delete(n)
        res.end()
        ended(ex)
      }
    }

    const endStreams = () => {
      let count = 0
      for (const ex of open.values()) {
        if (ex.kind !== "stream") continue
        ex.of.res.end()
        count++
      }
      return count
    }

    return { post, stream, deliver, endStreams } satisfies HttpExchanges
  })

