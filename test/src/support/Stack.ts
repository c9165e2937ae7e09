/**
 * A Switchboard stack for tests, built per test: bus (embedded or a NATS server), auth with a known
 * secret, the edge on a free port, and whatever service layers the test adds. Settings are passed
 * the way a deployment passes them, as environment variables, through a ConfigProvider.
 */
import { AuthClient, AuthService, Tokens } from "@switchboard/auth"
import { type Bus, type Journal, type Kv, MemoryBus, NatsBus } from "@switchboard/bus"
import { Edge, type Routes } from "@switchboard/edge"
import { NatsServer } from "@switchboard/testing"
import { Telemetry } from "@switchboard/telemetry"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import * as Scope from "effect/Scope"
import { createHmac } from "node:crypto"

export const SECRET = "test-secret-that-is-long-enough-for-hs256"

let counter = 0
export const namespace = () => `t${process.pid}n${counter++}`

/** The embedded bus, or NATS at `servers`; `replicas` for state that must survive a node of a cluster. */
export const busLayer = (servers?: ReadonlyArray<string>, ns = namespace(), replicas?: number): Layer.Layer<Bus.Bus | Kv.Kv | Journal.Journal, Bus.BusError> =>
  servers === undefined ? MemoryBus.layer : NatsBus.layer({ servers, namespace: ns, ...(replicas === undefined ? {} : { replicas }) })

export interface StackOptions {
  readonly env?: Readonly<Record<string, string>>
  readonly routes?: Routes.RouteTable
  /** Service layers that host actors next to the edge (they see the same bus). */
  readonly services?: Layer.Layer<never, unknown, Bus.Bus | Kv.Kv | Journal.Journal | AuthClient.AuthClient | Telemetry.Tracing>
  readonly tracing?: Layer.Layer<Telemetry.Tracing>
}

export const configFrom = (env: Readonly<Record<string, string>>) =>
  Layer.setConfigProvider(ConfigProvider.fromMap(new Map(Object.entries({ PORT: "0", SWITCHBOARD_JWT_SECRET: SECRET, ...env }))))

/** The edge with auth and the given services over the given bus. */
export const stack = (bus: Layer.Layer<Bus.Bus | Kv.Kv | Journal.Journal, Bus.BusError>, options: StackOptions = {}) =>
  Edge.layer(options.routes === undefined ? {} : { routes: options.routes }).pipe(
    Layer.provideMerge(options.services ?? Layer.empty),
    Layer.provideMerge(AuthClient.layer),
    Layer.provideMerge(AuthService.layer),
    Layer.provideMerge(Tokens.layer),
    Layer.provideMerge(options.tracing ?? Telemetry.disabled),
    Layer.provideMerge(bus),
    Layer.provide(configFrom(options.env ?? {})),
    Layer.provide(Logger.minimumLogLevel(process.env["SB_TEST_LOG"] === "debug" ? LogLevel.Debug : LogLevel.Error))
  )

/**
 * `services` behind an edge on the embedded bus, for as long as the scope lives: the edge's
 * http:// and ws:// base URLs, and the built context for tests that look inside (KV, journals).
 */
export const serve = (services: NonNullable<StackOptions["services"]>, env: Readonly<Record<string, string>> = {}) =>
  Effect.map(Layer.build(stack(busLayer(), { services, env })), (ctx) => {
    const url = Context.get(ctx, Edge.EdgeServer).url
    return { ctx, url, ws: url.replace("http", "ws") }
  })

/**
 * An edge with auth on the test's NATS, in a namespace of its own, for the tests that start and
 * stop service replicas (`replica`) beside it: the servers and namespace those replicas join, the
 * built context and the edge's ws:// base.
 */
export const natsEdge = (env: Readonly<Record<string, string>> = {}) =>
  Effect.gen(function*() {
    const { servers } = yield* NatsServer
    const ns = namespace()
    const ctx = yield* Layer.build(stack(busLayer(servers, ns), { env }))
    return { servers, ns, ctx, ws: Context.get(ctx, Edge.EdgeServer).url.replace("http", "ws") }
  })

/** Signs a token with the test secret. */
export const token = (options: Tokens.IssueOptions) =>
  Effect.flatMap(Tokens.Tokens, (t) => t.issue(options)).pipe(
    Effect.provide(Tokens.layer.pipe(Layer.provide(configFrom({})))),
    Effect.orDie
  )

/**
 * A token signed with `SECRET` that expired a minute ago: what a test of an expired token needs,
 * without waiting for one to run out. Written by hand, since `issue` (rightly) mints no such thing.
 */
export const expiredToken = (sub: string): string => {
  const part = (value: object) => Buffer.from(JSON.stringify(value)).toString("base64url")
  const now = Math.floor(Date.now() / 1000)
  const signed = `${part({ alg: "HS256", typ: "JWT" })}.${part({ sub, iat: now - 120, exp: now - 60 })}`
  return `${signed}.${createHmac("sha256", SECRET).update(signed).digest("base64url")}`
}

/**
 * One replica of a service on its own NATS connection, stoppable on its own (failover tests): its
 * scope is not the test's, so `stop` ends it mid-test.
 */
export const replica = (
  service: Layer.Layer<never, unknown, Bus.Bus | Kv.Kv | Journal.Journal | AuthClient.AuthClient | Telemetry.Tracing>,
  servers: ReadonlyArray<string>,
  ns: string,
  env: Readonly<Record<string, string>> = {},
  replicas?: number
) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    yield* Layer.buildWithScope(
      service.pipe(
        Layer.provide(AuthClient.layer),
        Layer.provide(busLayer(servers, ns, replicas)),
        Layer.provide(Telemetry.disabled),
        Layer.provide(configFrom(env)),
        Layer.provide(Logger.minimumLogLevel(LogLevel.Error))
      ),
      scope
    )
    return { stop: Scope.close(scope, Exit.void) }
  })
