/**
 * The router on the embedded bus, with auth and no edge and no sockets: tests stand where the
 * edge stands (`ActorClient`) and speak the proxy protocol as an extension or an MCP client, one
 * actor at a time.
 */
import { AuthClient, AuthService, Tokens } from "@switchboard/auth"
import { type Bus, Kv, MemoryBus } from "@switchboard/bus"
import { Telemetry } from "@switchboard/telemetry"
import * as ActorClient from "@switchboard/testing/ActorClient"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import type * as Scope from "effect/Scope"
import * as Router from "../src/Router.ts"

const SECRET = "router-unit-secret-that-is-long-enough-for-hs256"

/**
 * The router's layer and what it needs, settings given as a deployment gives them. `kv` wraps the
 * embedded KV, for a test that holds an operation back to order it against another.
 */
export const router = (env: Readonly<Record<string, string>> = {}, kv: (kv: Kv.KvShape) => Kv.KvShape = (kv) => kv) =>
  Router.layer.pipe(
    Layer.provideMerge(AuthClient.layer),
    Layer.provideMerge(AuthService.layer),
    Layer.provideMerge(Tokens.layer),
    Layer.provideMerge(Telemetry.disabled),
    Layer.provideMerge(Layer.effect(Kv.Kv, Effect.map(Kv.Kv, kv))),
    Layer.provideMerge(MemoryBus.layer),
    // A replica with no other to hand its sessions to gives up on that quickly.
    Layer.provide(
      Layer.setConfigProvider(
        ConfigProvider.fromMap(new Map(Object.entries({ SWITCHBOARD_JWT_SECRET: SECRET, ROUTER_SHUTDOWN_GRACE: "1 second", ...env })))
      )
    ),
    Layer.provide(Logger.minimumLogLevel(process.env["SB_TEST_LOG"] === "debug" ? LogLevel.Debug : LogLevel.Error))
  )

/**
 * Runs a test body against a fresh router: the body's scope (its clients) closes first, while the
 * bus is still up, so each client's actor ends before the replica stops.
 */
export const withRouter = <A, E>(
  body: Effect.Effect<A, E, Bus.Bus | Kv.Kv | Tokens.Tokens | Scope.Scope>,
  env: Readonly<Record<string, string>> = {},
  kv?: (kv: Kv.KvShape) => Kv.KvShape
) => Effect.scoped(body).pipe(Effect.provide(router(env, kv)))

/** A token for `sub`, signed with the router's secret. */
export const token = (sub: string) => Effect.flatMap(Tokens.Tokens, (t) => Effect.orDie(t.issue({ sub })))

export type Message = ActorClient.JsonRpcMessage

/** The next message the actor delivered to the socket, as JSON-RPC. */
export const next = ActorClient.nextMessage

/** The next delivery that is not a `status` keepalive. */
export const nextBut = (client: ActorClient.ActorClient, skip = "status") =>
  Effect.gen(function*() {
    while (true) {
      const m = yield* next(client)
      if (m.method !== skip) return m
    }
  })

/** Sends a request and takes deliveries until its response. */
export const call = (client: ActorClient.ActorClient, id: number, method: string, params?: unknown) =>
  Effect.gen(function*() {
    yield* client.send(params === undefined ? { jsonrpc: "2.0", id, method } : { jsonrpc: "2.0", id, method, params })
    while (true) {
      const m = yield* next(client)
      if (m.id === id && m.method === undefined) return m
    }
  })

/**
 * An extension of `user` that answered `authenticate` (with `client_id` when given): its client,
 * and the extension id the proxy gave it.
 */
export const extension = (user: string, options: { readonly name?: string; readonly clientId?: string } = {}) =>
  Effect.gen(function*() {
    const client = yield* ActorClient.open("router", { path: "/extension" })
    const asked = yield* next(client)
    if (asked.method !== "authenticate") return yield* Effect.dieMessage(`expected authenticate, got ${JSON.stringify(asked)}`)
    const accessToken = yield* token(user)
    yield* client.send({
      jsonrpc: "2.0",
      id: asked.id,
      result: { name: options.name ?? "Chrome 141", accessToken, ...(options.clientId === undefined ? {} : { client_id: options.clientId }) }
    })
    const authenticated = yield* next(client)
    const id = authenticated.params?.["extension_id"]
    if (authenticated.method !== "authenticated" || typeof id !== "string") {
      return yield* Effect.dieMessage(`expected authenticated, got ${JSON.stringify(authenticated)}`)
    }
    return { client, id }
  })

/** An MCP client of `user` that completed `mcp_handshake`. */
export const mcpClient = (user: string) =>
  Effect.gen(function*() {
    const client = yield* ActorClient.open("router", { path: "/mcp" })
    const hello = yield* call(client, 1, "mcp_handshake", { accessToken: yield* token(user) })
    if (hello.result?.["authenticated"] !== true) return yield* Effect.dieMessage(`handshake failed: ${JSON.stringify(hello)}`)
    return client
  })
