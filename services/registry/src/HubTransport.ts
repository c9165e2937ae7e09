/**
 * How a `/hub` session's messages reach its client: one session logic, two transports. A
 * WebSocket session sends everything down its socket. A Streamable HTTP session answers each
 * request on the HTTP exchange it came in on (on whichever edge), and pushes session
 * notifications to its current GET stream with event ids, keeping the last few for a stream that
 * resumes with `Last-Event-ID`, on any edge.
 */
import { type Actors, Subjects } from "@switchboard/bus"
import type { Registry } from "@switchboard/protocol"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"

/** Where the answer to one request goes, and the notifications about it that precede the answer. */
export interface Exchange {
  /** The final answer; an HTTP exchange ends with it. */
  readonly reply: (data: string, traceparent?: string) => void
  /** A notification about the request (progress), before its answer. */
  readonly notify: (data: string) => void
  /** The request ends with no answer (it was cancelled). */
  readonly end: () => void
  /** What another replica needs to answer on it (`resume`) once the session moved; none when nobody can be answered. */
  readonly ref: Registry.ExchangeRef | undefined
}

export interface HubTransport {
  /** WebSocket: a malformed message closes the session. HTTP: it is only answered. */
  readonly kind: "ws" | "http"
  /** Where the answers to this frame's request go. */
  readonly exchange: (frame: Actors.Frame) => Exchange
  /** The exchange `ref` names, on the replica the session was handed to. */
  readonly resume: (ref: Registry.ExchangeRef) => Exchange
  /** Whether this frame may speak for the session (an HTTP request's own token must be the session user's). */
  readonly admits: (frame: Actors.Frame, user: string | undefined) => boolean
  /** Transport control rather than a client message (an HTTP GET stream opened or closed); true when handled. */
  readonly control: (frame: Actors.Frame) => boolean
  /** A notification of the session, not of a request (`list_changed`). */
  readonly push: (data: string) => void
  /** Ends the session. */
  readonly close: (code: number, reason: string) => void
  /** The session ended: an open GET stream ends with it. */
  readonly ended: () => void
  /** The session moves to another replica: what its events need there (HTTP only). */
  readonly handOff: () => Registry.HttpStreamState | undefined
}

/**
 * Everything down the socket. A class, so that its methods are shared by every session instead of
 * being closures of each idle one (issue 16).
 */
class WebSocketTransport implements HubTransport, Exchange {
  readonly kind = "ws"
  readonly ref = wsRef
  constructor(private readonly conn: Actors.Connection) {}
  get reply() {
    return this.conn.send
  }
  get notify() {
    return this.conn.send
  }
  get push() {
    return this.conn.send
  }
  get close() {
    return this.conn.close
  }
  end() {}
  exchange(): Exchange {
    return this
  }
  resume(): Exchange {
    return this
  }
  admits() {
    return true
  }
  control() {
    return false
  }
  ended() {}
  handOff() {
    return undefined
  }
}

const wsRef: Registry.ExchangeRef = { kind: "ws" }

export const webSocket = (conn: Actors.Connection): HubTransport => new WebSocketTransport(conn)

export interface HttpOptions {
  /** Events kept for resumption, at most this many and this old. */
  readonly replayEvents: number
  readonly replayAge: Duration.DurationInput
  /** The session ends after this long without a message from its client. */
  readonly idle: Duration.DurationInput
}

interface Buffered {
  readonly id: string
  readonly seq: number
  readonly at: number
  readonly data: string
}

const noExchange: Exchange = { reply: () => {}, notify: () => {}, end: () => {}, ref: undefined }

/**
 * A Streamable HTTP session. Its timers live in the actor's scope. Event ids are `<epoch>.<n>`:
 * an actor adopted by another replica after a crash starts a new epoch, so an id from before
 * can't be taken for one of its own. One handed over (`handedOver`) goes on with the old epoch,
 * its kept events and its open GET stream, so its client sees no seam.
 */
export const http = (
  conn: Actors.Connection,
  link: Effect.Effect.Success<typeof Actors.edgeLink>,
  options: HttpOptions,
  handedOver?: Registry.HttpStreamState
): Effect.Effect<HubTransport, never, Scope.Scope> =>
  Effect.gen(function*() {
    const epoch = handedOver?.epoch ?? Date.now().toString(36)
    let seq = handedOver?.seq ?? 0
    const buffer: Array<Buffered> = handedOver === undefined ? [] : [...handedOver.events]
    const ageMillis = Duration.toMillis(options.replayAge)
    const attach = (edge: Subjects.EdgeId, exchange: string) => ({ edge, exchange, out: link.exchange(edge, conn.id, exchange) })
    let stream: { readonly edge: Subjects.EdgeId; readonly exchange: string; readonly out: Actors.HttpExchange } | undefined =
      handedOver?.open === undefined ? undefined : attach(Subjects.EdgeId(handedOver.open.edge), handedOver.open.exchange)

    const close = (code: number, reason: string) => conn.close(code, reason)
    const idle = setTimeout(() => close(1000, "session idle"), Duration.toMillis(options.idle))
    idle.unref()
    yield* Effect.addFinalizer(() => Effect.sync(() => clearTimeout(idle)))

    const trim = (now: number) => {
      let drop = Math.max(0, buffer.length - options.replayEvents)
      while (drop < buffer.length && now - buffer[drop]!.at > ageMillis) drop++
      if (drop > 0) buffer.splice(0, drop)
    }

    const endStream = () => {
      stream?.out.send("", { end: true })
      stream = undefined
    }

    const opened = (frame: Actors.Frame) => {
      const edge = frame.edge
      const exchange = frame.http
      if (edge === undefined || exchange === undefined) return
      // One stream gets the session's events: a newer one takes over, and the older one ends.
      if (stream !== undefined && (stream.edge !== edge || stream.exchange !== exchange)) endStream()
      stream = attach(edge, exchange)
      const out = stream.out
      const after = frame.lastEventId
      // The acknowledgement, before anything else: the edge answers the GET only once the stream
      // is attached here, so a client that has its 200 misses nothing. Its id is where this
      // stream starts, for a client that is cut before the first event to resume from.
      out.send("", { eventId: after ?? `${epoch}.${seq}` })
      if (after === undefined) return
      trim(Date.now())
      for (const e of buffer.slice(replayFrom(after))) out.send(e.data, { eventId: e.id })
    }

    /**
     * The first kept event after `id`. An id of another epoch (from before an adoption) gets all
     * that was kept: the best this session can do, and a repeated list_changed costs the client
     * one tools/list. Within the epoch, events up to `id` were seen, trimmed or not.
     */
    const replayFrom = (id: string) => {
      const dot = id.lastIndexOf(".")
      if (id.slice(0, dot) !== epoch) return 0
      const n = Number(id.slice(dot + 1))
      const from = buffer.findIndex((e) => e.seq > n)
      return from < 0 ? buffer.length : from
    }

    const exchangeOn = (edge: Subjects.EdgeId, exchange: string): Exchange => {
      const out = link.exchange(edge, conn.id, exchange)
      return {
        reply: (data, traceparent) => out.send(data, traceparent === undefined ? { end: true } : { end: true, traceparent }),
        notify: (data) => out.send(data),
        end: () => out.send("", { end: true }),
        ref: { kind: "http", edge, http: exchange }
      }
    }

    return {
      kind: "http",
      exchange: (frame) => {
        idle.refresh()
        const edge = frame.edge
        const exchange = frame.http
        if (edge === undefined || exchange === undefined) return noExchange
        return exchangeOn(edge, exchange)
      },
      // The POST waits at its edge for its answer, whichever replica sends it.
      resume: (ref) => (ref.kind === "http" ? exchangeOn(Subjects.EdgeId(ref.edge), ref.http) : noExchange),
      admits: (frame, user) => frame.user !== undefined && frame.user === user,
      control: (frame) => {
        const op = frame.httpOp
        if (op === undefined) return false
        idle.refresh()
        if (op === "stream") opened(frame)
        else if (op === "stream-closed" && stream !== undefined && stream.edge === frame.edge && stream.exchange === frame.http) stream = undefined
        return true
      },
      push: (data) => {
        const now = Date.now()
        const id = `${epoch}.${++seq}`
        if (options.replayEvents > 0) {
          buffer.push({ id, seq, at: now, data })
          trim(now)
        }
        stream?.out.send(data, { eventId: id })
      },
      close,
      ended: endStream,
      handOff: () => ({
        epoch,
        seq,
        events: [...buffer],
        ...(stream === undefined ? {} : { open: { edge: stream.edge, exchange: stream.exchange } })
      })
    } satisfies HubTransport
  })
