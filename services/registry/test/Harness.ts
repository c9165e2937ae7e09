/**
 * The registry on the embedded bus, with no edge and no sockets: tests stand where the edge stands
 * (`ActorClient`) and speak MCP-B as a tab and MCP as a hub client, one actor at a time.
 */
import { AuthClient } from "@switchboard/auth"
import { type Bus, type Journal, type Kv, MemoryBus } from "@switchboard/bus"
import { Telemetry } from "@switchboard/telemetry"
import * as ActorClient from "@switchboard/testing/ActorClient"
import * as ConfigProvider from "effect/ConfigProvider"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import * as Registry from "../src/Registry.ts"

/** The bus and KV the registry runs on: the embedded one unless a test gives NATS. */
export type BusLayer = Layer.Layer<Bus.Bus | Kv.Kv | Journal.Journal, Bus.BusError>

/**
 * The registry's layer and what it needs, settings given as a deployment gives them. With `logs`,
 * its warnings and errors are kept there, one line each, for a test to read.
 */
export const registry = (env: Readonly<Record<string, string>> = {}, logs?: Array<string>, bus: BusLayer = MemoryBus.layer) =>
  Registry.layer.pipe(
    Layer.provideMerge(AuthClient.layer),
    Layer.provideMerge(Telemetry.disabled),
    Layer.provideMerge(bus),
    // A replica with no other to hand its sessions to gives up on that quickly.
    Layer.provide(Layer.setConfigProvider(ConfigProvider.fromMap(new Map(Object.entries({ REGISTRY_SHUTDOWN_GRACE: "1 second", ...env }))))),
    Layer.provide(
      logs === undefined
        ? Logger.minimumLogLevel(process.env["SB_TEST_LOG"] === "debug" ? LogLevel.Debug : LogLevel.Error)
        : Layer.merge(
          Logger.replace(Logger.defaultLogger, Logger.make(({ message }) => void logs.push(Array.isArray(message) ? message.map(String).join(" ") : String(message)))),
          Logger.minimumLogLevel(LogLevel.Warning)
        )
    )
  )

/**
 * Runs a test body against a fresh registry: the body's scope (its clients) closes first, while
 * the bus is still up, so each client's actor ends before the replica stops.
 */
export const withRegistry = <A, E>(
  body: Effect.Effect<A, E, Bus.Bus | Kv.Kv | Scope.Scope>,
  env: Readonly<Record<string, string>> = {},
  logs?: Array<string>,
  bus?: BusLayer
) => Effect.scoped(body).pipe(Effect.provide(registry(env, logs, bus)))

export type JsonRpcMessage = ActorClient.JsonRpcMessage

/** One socket's side of a JSON-RPC conversation: requests with their own ids, notifications kept aside. */
export interface Peer {
  readonly client: ActorClient.ActorClient
  /** Sends a request and returns its response; what arrives before it is kept in `received`. */
  readonly request: (method: string, params?: unknown) => Effect.Effect<JsonRpcMessage>
  readonly notify: (method: string, params?: unknown) => Effect.Effect<void>
  /** The next message that is not a response to one of this peer's requests. */
  readonly nextMessage: Effect.Effect<JsonRpcMessage>
  /** The response with this id, sent without `request`; what arrives before it is kept in `received`. */
  readonly responseTo: (id: string | number) => Effect.Effect<JsonRpcMessage>
  /** Every message taken so far that was not a response to `request`. */
  readonly received: ReadonlyArray<JsonRpcMessage>
}


export const peer = (client: ActorClient.ActorClient): Peer => {
  let ids = 0
  const received: Array<JsonRpcMessage> = []
  const backlog: Array<JsonRpcMessage> = []
  const take = ActorClient.nextMessage(client)
  const nextMessage = Effect.suspend(() => {
    const queued = backlog.shift()
    if (queued !== undefined) return Effect.succeed(queued)
    return Effect.tap(take, (m) => Effect.sync(() => received.push(m)))
  })
  return {
    client,
    received,
    request: (method, params) =>
      Effect.gen(function*() {
        const id = `t${++ids}`
        yield* client.send(params === undefined ? { jsonrpc: "2.0", id, method } : { jsonrpc: "2.0", id, method, params })
        while (true) {
          const m = yield* take
          if (m.id === id && m.method === undefined) return m
          received.push(m)
          backlog.push(m)
        }
      }),
    notify: (method, params) => client.send(params === undefined ? { jsonrpc: "2.0", method } : { jsonrpc: "2.0", method, params }),
    nextMessage,
    responseTo: (id) =>
      Effect.gen(function*() {
        while (true) {
          const m = yield* nextMessage
          if (m.id === id && m.method === undefined) return m
        }
      })
  }
}

const tool = (name: string, extra: Record<string, unknown> = {}) => ({ name, description: `${name} tool`, inputSchema: { type: "object" }, ...extra })

/** A tab that said hello and registered `tools` (names, or whole tool objects). */
export const tab = (options: { readonly user: string; readonly tabId: number; readonly url: string; readonly tools: ReadonlyArray<string | Record<string, unknown>> }) =>
  Effect.gen(function*() {
    const client = yield* ActorClient.open("registry", { path: "/tabs", user: options.user })
    const p = peer(client)
    const hello = yield* p.request("browser/hello", { tabId: options.tabId, url: options.url })
    if (hello.error !== undefined) return yield* Effect.dieMessage(`hello refused: ${hello.error.message}`)
    const registered = yield* p.request("browser/registerTools", { tools: options.tools.map((t) => (typeof t === "string" ? tool(t) : t)) })
    if (registered.error !== undefined) return yield* Effect.dieMessage(`registerTools refused: ${registered.error.message}`)
    return p
  })

/** An initialized `/hub` session of `user`. */
export const hub = (user: string) =>
  Effect.gen(function*() {
    const p = peer(yield* ActorClient.open("registry", { path: "/hub", user }))
    yield* p.request("initialize", { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "unit", version: "0" } })
    yield* p.notify("notifications/initialized")
    return p
  })

/** `tools/list` until the names satisfy `ok`: the hub's view follows KV, so a tab's tools show up shortly after it registers. */
export const toolsUntil = (hub: Peer, ok: (names: ReadonlyArray<string>) => boolean) =>
  Effect.gen(function*() {
    const listed = yield* hub.request("tools/list")
    const names = ((listed.result?.["tools"] ?? []) as ReadonlyArray<{ readonly name: string }>).map((t) => t.name)
    return ok(names) ? Effect.succeed(names) : Effect.fail(names)
  }).pipe(
    Effect.flatten,
    Effect.retry({ schedule: Schedule.spaced("10 millis"), times: 300 }),
    Effect.orDieWith((names) => new Error(`tools/list never matched; last: ${JSON.stringify(names)}`))
  )

/** Polls `check` until it holds, for at most 300 tries `every` apart. */
export const eventually = <E, R>(check: Effect.Effect<boolean, E, R>, what: string, every: Duration.DurationInput = "10 millis") =>
  check.pipe(
    Effect.orDie,
    Effect.flatMap((ok) => (ok ? Effect.void : Effect.fail(what))),
    Effect.retry({ schedule: Schedule.spaced(every), times: 300 }),
    Effect.orDieWith((w) => new Error(`never: ${w}`))
  )
