/**
 * What services send to this edge (its outbound subject), handed to the part that holds the
 * connection: a WebSocket's to the socket I/O, a Streamable HTTP exchange's (it carries `sb-http`)
 * to the HTTP side. Neither part knows of the other.
 */
import { Bus, Subjects } from "@switchboard/bus"
import { Telemetry } from "@switchboard/telemetry"
import { SpanKind } from "@opentelemetry/api"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type * as Scope from "effect/Scope"

export interface OutboundOptions {
  readonly edgeId: Subjects.EdgeId
  /** The socket I/O's handler; false for a delivery to a connection with no socket here. */
  readonly sockets: (m: Bus.BusMessage) => boolean
  /** Delivers to one of this edge's Streamable HTTP exchanges; undefined when none is served. */
  readonly http: ((m: Bus.BusMessage) => void) | undefined
  readonly logCaught: (what: string, cause: unknown, about: Readonly<Record<string, string>>) => void
}

/** Subscribes to this edge's outbound subject until the scope closes. */
export const subscribe = (options: OutboundOptions): Effect.Effect<void, Bus.BusError, Bus.Bus | Telemetry.Tracing | Scope.Scope> =>
  Effect.gen(function*() {
    const bus = yield* Bus.Bus
    const { tracer } = yield* Telemetry.Tracing
    const { edgeId, sockets, http, logCaught } = options

    // A delivery's span covers whichever part takes it.
    const deliverSpan = (traceparent: string | undefined, conns: string) =>
      Option.isNone(tracer) || traceparent === undefined
        ? undefined
        : Telemetry.startSpan(tracer.value, "edge.deliver", traceparent, {
          kind: SpanKind.PRODUCER,
          attributes: { "sb.conn": conns, "sb.edge": edgeId }
        }).span

    const dispatch = (m: Bus.BusMessage) => {
      if (m.header(Subjects.Header.op) !== "deliver") return void sockets(m)
      const one = m.header(Subjects.Header.conn)
      const span = deliverSpan(m.header(Subjects.Header.traceparent), one ?? m.header(Subjects.Header.conns) ?? "")
      if (!sockets(m) && one !== undefined && http !== undefined && m.header(Subjects.Header.http) !== undefined) http(m)
      span?.end()
    }

    yield* bus.subscribe(Subjects.edgeOut(edgeId), (m) => {
      try {
        dispatch(m)
      } catch (cause) {
        logCaught("edge: outbound message handler threw", cause, { subject: m.subject, op: m.header(Subjects.Header.op) ?? "" })
      }
    })
  })
