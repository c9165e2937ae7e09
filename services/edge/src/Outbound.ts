/**
 * What services send to this edge (its outbound subject), handed to the part that holds the
 * connection: a WebSocket's to the socket I/O, a Streamable HTTP exchange's (it carries `sb-http`)
 * to the HTTP side. Neither part knows of the other.
 */
import { Bus, Subjects } from "@switchboard/bus"
import { Envelope } from "@switchboard/protocol"
import { Telemetry } from "@switchboard/telemetry"
import { SpanKind } from "@opentelemetry/api"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as FiberSet from "effect/FiberSet"
import * as Option from "effect/Option"
import type * as Scope from "effect/Scope"

/** What the socket I/O takes: everything but an exchange's delivery. */
export type ToSockets = Exclude<Envelope.EdgeOut, Envelope.Exchange>

export interface OutboundOptions {
  readonly edgeId: Subjects.EdgeId
  /** The socket I/O's handler. */
  readonly sockets: (out: ToSockets, data: Uint8Array) => void
  /** Delivers to one of this edge's Streamable HTTP exchanges; undefined when none is served. */
  readonly http: ((delivery: Envelope.Exchange, data: Uint8Array) => void) | undefined
  readonly logCaught: (what: string, cause: unknown, about: Readonly<Record<string, string>>) => void
}

/** Subscribes to this edge's outbound subject until the scope closes. */
export const subscribe = (options: OutboundOptions): Effect.Effect<void, Bus.BusError, Bus.Bus | Telemetry.Tracing | Scope.Scope> =>
  Effect.gen(function*() {
    const bus = yield* Bus.Bus
    const { tracer } = yield* Telemetry.Tracing
    const { edgeId, sockets, http, logCaught } = options
    const runFork = yield* FiberSet.makeRuntime<never>()

    // A delivery's span covers whichever part takes it.
    const deliverSpan = (traceparent: string | undefined, conns: string) =>
      Option.isNone(tracer) || traceparent === undefined
        ? undefined
        : Telemetry.startSpan(tracer.value, "edge.deliver", traceparent, {
          kind: SpanKind.PRODUCER,
          attributes: { "sb.conn": conns, "sb.edge": edgeId }
        }).span

    const dispatch = (m: Bus.BusMessage) => {
      const decoded = Envelope.decodeEdgeOut(m)
      if (Either.isLeft(decoded)) return void runFork(Effect.logWarning(`edge: dropped a message to its connections: ${decoded.left}`))
      const out = decoded.right
      switch (out._tag) {
        case "Exchange": {
          const span = deliverSpan(out.traceparent, out.conn)
          http?.(out, m.data)
          return span?.end()
        }
        case "Deliver":
        case "Fanout": {
          const span = deliverSpan(out.traceparent, out._tag === "Deliver" ? out.conn : out.conns.join(","))
          sockets(out, m.data)
          return span?.end()
        }
        default:
          sockets(out, m.data)
      }
    }

    yield* bus.subscribe(Subjects.edgeOut(edgeId), (m) => {
      try {
        dispatch(m)
      } catch (cause) {
        logCaught("edge: outbound message handler threw", cause, { subject: m.subject, op: m.header(Subjects.Header.op) ?? "" })
      }
    })
  })
