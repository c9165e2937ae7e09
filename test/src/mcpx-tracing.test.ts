/**
 * An MCPx envelope carries one trace from the sender's edge through the broker (accept, then the
 * topic's fan-out) to every delivering edge, on the embedded bus and across NATS with the
 * participants on different edges.
 */
import { describe, expect, it } from "@effect/vitest"
import { InMemorySpanExporter, type ReadableSpan } from "@opentelemetry/sdk-trace-base"
import { AuthClient, AuthService, Tokens } from "@switchboard/auth"
import { Broker } from "@switchboard/broker"
import { Edge } from "@switchboard/edge"
import { Telemetry } from "@switchboard/telemetry"
import { NatsServer } from "@switchboard/testing"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import { join } from "./support/Participants.ts"
import { busLayer, configFrom, namespace, stack } from "./support/Stack.ts"

/** The spans of the trace that accepted the envelope, once `deliveries` edge.deliver spans have ended. */
const traceOf = (exporter: InMemorySpanExporter, envelopeId: string, deliveries: number) =>
  Effect.suspend(() => {
    const spans = exporter.getFinishedSpans()
    const accept = spans.find((s) => s.name === "broker.accept chat" && s.attributes["mcpx.envelope.id"] === envelopeId)
    const trace = accept === undefined ? [] : spans.filter((s) => s.spanContext().traceId === accept.spanContext().traceId)
    return accept !== undefined && trace.filter((s) => s.name === "edge.deliver").length >= deliveries
      ? Effect.succeed({ accept, trace })
      : Effect.fail(new Error("trace not complete yet"))
  }).pipe(Effect.retry(Schedule.spaced("20 millis")), Effect.timeout("5 seconds"))

const parentOf = (s: ReadableSpan) => s.parentSpanContext?.spanId
const idOf = (s: ReadableSpan) => s.spanContext().spanId

const assertShape = (trace: ReadonlyArray<ReadableSpan>, accept: ReadableSpan, deliveries: number) => {
  const receive = trace.find((s) => s.name === "edge.receive")
  const fanout = trace.find((s) => s.name === "broker.fanout")
  expect(receive).toBeDefined()
  expect(fanout).toBeDefined()
  expect(parentOf(receive!)).toBeUndefined()
  expect(parentOf(accept)).toBe(idOf(receive!))
  expect(parentOf(fanout!)).toBe(idOf(accept))
  const delivers = trace.filter((s) => s.name === "edge.deliver")
  expect(delivers).toHaveLength(deliveries)
  for (const d of delivers) expect(parentOf(d)).toBe(idOf(fanout!))
  expect(accept.attributes).toMatchObject({ "mcpx.topic": "traced", "mcpx.from": "alice" })
}

describe("MCPx tracing", () => {
  it.scopedLive("one chat envelope is one trace: edge.receive → broker.accept → broker.fanout → edge.deliver", () =>
    Effect.gen(function*() {
      const exporter = new InMemorySpanExporter()
      const ctx = yield* Layer.build(stack(busLayer(), { services: Broker.layer, tracing: Telemetry.layerMemory("switchboard", exporter) }))
      const ws = (ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape).url.replace("http", "ws")
      const alice = yield* join(ws, "traced", { id: "alice" })
      const bob = yield* join(ws, "traced", { id: "bob" })
      const sent = alice.send({ kind: "chat", payload: { text: "hi" } })
      yield* bob.next("chat")
      const { accept, trace } = yield* traceOf(exporter, sent.id, 1)
      // Both members are on one edge: one delivery span for one publish to that edge.
      assertShape(trace, accept, 1)
    }))

  it.scopedLive("across NATS, the fan-out reaches each edge with the same trace", () =>
    Effect.gen(function*() {
      const exporter = new InMemorySpanExporter()
      const { servers } = yield* NatsServer
      const ns = namespace()
      const connection = (service: string) => Layer.merge(Telemetry.layerMemory(service, exporter), busLayer(servers, ns))
      yield* Layer.build(
        Broker.layer.pipe(
          Layer.provideMerge(AuthClient.layer),
          Layer.provideMerge(AuthService.layer),
          Layer.provideMerge(Tokens.layer),
          Layer.provideMerge(connection("switchboard-broker")),
          Layer.provide(configFrom({}))
        )
      )
      const edge = (name: string) =>
        Effect.map(
          Layer.build(Edge.layer().pipe(Layer.provide(AuthClient.layer), Layer.provide(connection(name)), Layer.provide(configFrom({})))),
          (c) => (c.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape).url.replace("http", "ws")
        )
      const [a, b] = [yield* edge("switchboard-edge-a"), yield* edge("switchboard-edge-b")]
      const alice = yield* join(a!, "traced", { id: "alice" })
      const bob = yield* join(b!, "traced", { id: "bob" })
      const sent = alice.send({ kind: "chat", payload: { text: "hi" } })
      yield* bob.next("chat")
      yield* alice.next("chat")
      const { accept, trace } = yield* traceOf(exporter, sent.id, 2)
      assertShape(trace, accept, 2)
      const services = new Set(trace.map((s) => s.resource.attributes["service.name"]))
      expect(services).toEqual(new Set(["switchboard-edge-a", "switchboard-edge-b", "switchboard-broker"]))
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)
})
