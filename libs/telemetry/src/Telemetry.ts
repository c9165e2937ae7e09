/**
 * OpenTelemetry for every Switchboard process: OTLP/HTTP export when `OTEL_EXPORTER_OTLP_ENDPOINT`
 * is set, nothing otherwise, and an in-memory exporter for tests. W3C trace context travels in bus
 * headers; `traceHeaders` and `parentSpan` convert between the two.
 */
import * as OtelResource from "@effect/opentelemetry/Resource"
import * as OtelTracer from "@effect/opentelemetry/Tracer"
import type * as Otel from "@opentelemetry/api"
import { context as otelContext, trace } from "@opentelemetry/api"
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http"
import {
  BatchSpanProcessor,
  type InMemorySpanExporter,
  SimpleSpanProcessor,
  type SpanProcessor
} from "@opentelemetry/sdk-trace-base"
import { resourceFromAttributes } from "@opentelemetry/resources"
import { NodeTracerProvider } from "@opentelemetry/sdk-trace-node"
import { ATTR_SERVICE_NAME } from "@opentelemetry/semantic-conventions"
import * as Config from "effect/Config"
import * as ConfigError from "effect/ConfigError"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Tracer from "effect/Tracer"

/**
 * The raw OTel tracer when tracing is on. Hot paths that must not pay for an Effect per frame
 * (the edge's socket loop) use it directly; everything else uses `Effect.withSpan`.
 */
export class Tracing extends Context.Tag("@switchboard/telemetry/Tracing")<
  Tracing,
  { readonly tracer: Option.Option<Otel.Tracer> }
>() {}

const withProcessor = (serviceName: string, processor: SpanProcessor): Layer.Layer<Tracing> => {
  // The provider's resource is what backends group spans by; without it every process is
  // "unknown_service".
  const provider = Layer.scoped(
    OtelTracer.OtelTracerProvider,
    Effect.acquireRelease(
      Effect.sync(
        () => new NodeTracerProvider({ resource: resourceFromAttributes({ [ATTR_SERVICE_NAME]: serviceName }), spanProcessors: [processor] })
      ),
      (p) => Effect.promise(() => p.shutdown())
    )
  )
  const tracing = Layer.effect(
    Tracing,
    Effect.map(OtelTracer.OtelTracer, (tracer) => ({ tracer: Option.some(tracer) }))
  )
  return tracing.pipe(
    Layer.provideMerge(OtelTracer.layer),
    Layer.provide(provider),
    Layer.provide(OtelResource.layer({ serviceName })),
    Layer.map((ctx) => Context.pick(Tracing)(ctx))
  )
}

export const disabled: Layer.Layer<Tracing> = Layer.succeed(Tracing, { tracer: Option.none() })

/** Export spans to an in-memory exporter, synchronously, for tests. */
export const layerMemory = (serviceName: string, exporter: InMemorySpanExporter): Layer.Layer<Tracing> =>
  withProcessor(serviceName, new SimpleSpanProcessor(exporter))

export const otlpEndpoint = Config.option(
  Config.string("OTEL_EXPORTER_OTLP_ENDPOINT").pipe(
    Config.mapOrFail((text) =>
      URL.canParse(text) && /^https?:$/.test(new URL(text).protocol)
        ? Either.right(text)
        : Either.left(ConfigError.InvalidData([], `OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or https:// URL, got ${JSON.stringify(text)}`))
    ),
    Config.withDescription("OTLP/HTTP collector base URL; spans are exported only when set")
  )
)

/** OTLP/HTTP export when `OTEL_EXPORTER_OTLP_ENDPOINT` is set; otherwise tracing is off. */
export const layer = (serviceName: string): Layer.Layer<Tracing, ConfigError.ConfigError> =>
  Layer.unwrapEffect(
    Effect.map(
      otlpEndpoint,
      Option.match({
        onNone: () => disabled,
        onSome: (endpoint) =>
          withProcessor(
            serviceName,
            new BatchSpanProcessor(new OTLPTraceExporter({ url: `${endpoint.replace(/\/$/, "")}/v1/traces` }))
          )
      })
    )
  )

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/

/** `traceparent`/`tracestate` headers for a span, to put on a bus message. */
export const traceHeaders = (span: { readonly traceId: string; readonly spanId: string; readonly sampled: boolean }) => ({
  traceparent: `00-${span.traceId}-${span.spanId}-${span.sampled ? "01" : "00"}`
})

/** The remote parent a message carries, if its `traceparent` is well formed. */
export const parentSpan = (traceparent: string | undefined): Option.Option<Tracer.ExternalSpan> => {
  if (traceparent === undefined) return Option.none()
  const m = TRACEPARENT.exec(traceparent)
  if (m === null) return Option.none()
  return Option.some(
    Tracer.externalSpan({ traceId: m[1]!, spanId: m[2]!, sampled: (Number.parseInt(m[3]!, 16) & 1) === 1 })
  )
}

/** Runs `effect` as a child of the trace a message carries, or as a new root when it carries none. */
export const withRemoteParent = (traceparent: string | undefined) =>
<A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Option.match(parentSpan(traceparent), {
    onNone: () => effect,
    onSome: (parent) => Effect.withParentSpan(effect, parent)
  })

/**
 * Starts a span with the OTel API directly, for synchronous hot paths: a child of `traceparent`
 * when it is given and well formed, a new root otherwise. Returns the span and its own
 * traceparent for the next hop.
 */
export const startSpan = (
  tracer: Otel.Tracer,
  name: string,
  traceparent: string | undefined,
  options: { readonly kind: Otel.SpanKind; readonly attributes: Otel.Attributes }
): { readonly span: Otel.Span; readonly traceparent: string } => {
  const parent = parentSpan(traceparent)
  const ctx = Option.isSome(parent)
    ? trace.setSpanContext(otelContext.active(), {
      traceId: parent.value.traceId,
      spanId: parent.value.spanId,
      traceFlags: parent.value.sampled ? 1 : 0,
      isRemote: true
    })
    : otelContext.active()
  const span = tracer.startSpan(name, { kind: options.kind, attributes: options.attributes }, ctx)
  const sc = span.spanContext()
  return { span, traceparent: traceHeaders({ traceId: sc.traceId, spanId: sc.spanId, sampled: (sc.traceFlags & 1) === 1 }).traceparent }
}
