/**
 * The router's internal client: another service asks a user's connected extension to run a proxy
 * method (the registry's `createTab`), as the proxy itself. Real sockets, the embedded bus, and
 * once across NATS with two router replicas.
 */
import { describe, expect, it } from "@effect/vitest"
import { Edge } from "@switchboard/edge"
import { Router } from "@switchboard/router"
import { NatsServer } from "@switchboard/testing"
import { InternalClient, Kv, Subjects } from "@switchboard/bus"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import { attach, call, client, extensionOf, next } from "./support/ProxyPeers.ts"
import { busLayer, namespace, replica, stack } from "./support/Stack.ts"

const PROXY_ID = /^proxy:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

const start = (env: Record<string, string> = {}, bus = busLayer()) =>
  Effect.gen(function*() {
    const ctx = yield* Layer.build(stack(bus, { services: Router.layer, env }))
    const edge = ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape
    /** Runs the registry's call in the background, on the stack's bus. */
    const ask = (user: string, method: string, params?: Record<string, unknown>) =>
      InternalClient.request(user, method, params).pipe(Effect.provide(ctx), Effect.fork)
    return { ws: edge.url.replace("http", "ws"), ask, kv: Context.get(ctx, Kv.Kv) }
  })

const failureOf = <A>(fiber: Fiber.Fiber<A, InternalClient.InternalError>) => Effect.flip(Fiber.join(fiber))

describe("router internal client", () => {
  it.scopedLive("a connected extension gets createTab with a proxy: id, and the caller gets its result", () =>
    Effect.gen(function*() {
      const { ws, ask } = yield* start()
      const ext = yield* extensionOf(ws, "alice")
      // An MCP client in session with the same extension meanwhile: the two kinds of ids never mix.
      const mcp = yield* client(ws, "alice")
      const connectionId = yield* attach(mcp, ext.id)

      const pending = yield* ask("alice", "createTab", { url: "https://example.com" })
      const asked = yield* next(ext.c)
      expect(asked).toEqual({ jsonrpc: "2.0", id: expect.stringMatching(PROXY_ID), method: "createTab", params: { url: "https://example.com" } })
      mcp.send({ jsonrpc: "2.0", id: 7, method: "getTabs" })
      const forwarded = yield* next(ext.c)
      expect(forwarded.id).toBe(`${connectionId}:7`)
      ext.c.send({ jsonrpc: "2.0", id: forwarded.id, result: { tabs: [] } })
      ext.c.send({ jsonrpc: "2.0", id: asked.id, result: { tabId: 42, url: "https://example.com" } })
      expect(yield* Fiber.join(pending)).toEqual({ tabId: 42, url: "https://example.com" })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 7, result: { tabs: [] } })

      // Without params the extension gets none; a second answer to the same id goes nowhere.
      const bare = yield* ask("alice", "getTabs")
      const askedBare = yield* next(ext.c)
      expect(askedBare).toEqual({ jsonrpc: "2.0", id: expect.stringMatching(PROXY_ID), method: "getTabs" })
      expect(askedBare.id).not.toBe(asked.id)
      ext.c.send({ jsonrpc: "2.0", id: asked.id, result: { late: true } })
      ext.c.send({ jsonrpc: "2.0", id: askedBare.id, result: [] })
      expect(yield* Fiber.join(bare)).toEqual([])
    }))

  it.scopedLive("an extension's error comes back as InternalError with its code and message", () =>
    Effect.gen(function*() {
      const { ws, ask } = yield* start()
      const ext = yield* extensionOf(ws, "alice")
      const refused = yield* ask("alice", "createTab", { url: "chrome://settings" })
      const asked = yield* next(ext.c)
      ext.c.send({ jsonrpc: "2.0", id: asked.id, error: { code: -32001, message: "Tab creation failed: Permission denied" } })
      const error = yield* failureOf(refused)
      expect(error).toBeInstanceOf(InternalClient.InternalError)
      expect(error).toMatchObject({ _tag: "InternalError", code: -32001, message: "Tab creation failed: Permission denied" })

      // An answer with neither result nor error is the extension's fault: -32603.
      const empty = yield* ask("alice", "createTab", { url: "https://example.com" })
      ext.c.send({ jsonrpc: "2.0", id: (yield* next(ext.c)).id })
      expect(yield* failureOf(empty)).toMatchObject({ code: -32603 })
    }))

  it.scopedLive("fails with -32000 when the user has no extension; another user's is never used", () =>
    Effect.gen(function*() {
      const { ws, ask } = yield* start()
      const alices = yield* extensionOf(ws, "alice")
      expect(yield* failureOf(yield* ask("bob", "createTab", { url: "https://example.com" }))).toMatchObject({
        code: -32000,
        message: "No browser extension is connected for this user"
      })
      // The first thing Alice's extension sees is Alice's own request.
      const alicesOwn = yield* ask("alice", "createTab", { url: "https://alice.example" })
      const asked = yield* next(alices.c)
      expect(asked.params).toEqual({ url: "https://alice.example" })
      alices.c.send({ jsonrpc: "2.0", id: asked.id, result: { tabId: 1 } })
      expect(yield* Fiber.join(alicesOwn)).toEqual({ tabId: 1 })
    }))

  it.scopedLive("fails at once when the extension closes with a request pending, and after the timeout otherwise", () =>
    Effect.gen(function*() {
      const { ws, ask } = yield* start({ ROUTER_INTERNAL_TIMEOUT: "30 seconds" })
      const ext = yield* extensionOf(ws, "alice")
      const pending = yield* ask("alice", "createTab", { url: "https://example.com" })
      yield* next(ext.c)
      ext.c.ws.close()
      const error = yield* failureOf(pending).pipe(Effect.timeoutFail({ duration: "5 seconds", onTimeout: () => new Error("not at once") }))
      expect(error).toMatchObject({ code: -32000, message: "Extension disconnected" })
      expect(yield* failureOf(yield* ask("alice", "createTab", { url: "https://example.com" }))).toMatchObject({
        code: -32000,
        message: "No browser extension is connected for this user"
      })
    }))

  it.scopedLive("times out an unanswered request with -32000 and drops the late answer", () =>
    Effect.gen(function*() {
      const { ws, ask } = yield* start({ ROUTER_INTERNAL_TIMEOUT: "300 millis" })
      const ext = yield* extensionOf(ws, "alice")
      const pending = yield* ask("alice", "hang")
      const asked = yield* next(ext.c)
      expect(yield* failureOf(pending)).toMatchObject({ code: -32000, message: "Request timed out after 300ms" })
      ext.c.send({ jsonrpc: "2.0", id: asked.id, result: { tooLate: true } })
      const again = yield* ask("alice", "getTabs")
      const second = yield* next(ext.c)
      ext.c.send({ jsonrpc: "2.0", id: second.id, result: { ok: true } })
      expect(yield* Fiber.join(again)).toEqual({ ok: true })
    }))

  it.scopedLive("with two extensions of the user, the most recently connected one answers", () =>
    Effect.gen(function*() {
      const { ws, ask } = yield* start()
      const older = yield* extensionOf(ws, "alice", "Chrome")
      // connectedAt has millisecond resolution: make sure the two differ.
      yield* Effect.sleep("5 millis")
      const newer = yield* extensionOf(ws, "alice", "Firefox")
      const first = yield* ask("alice", "createTab", { url: "https://example.com" })
      const asked = yield* next(newer.c)
      newer.c.send({ jsonrpc: "2.0", id: asked.id, result: { from: "newer" } })
      expect(yield* Fiber.join(first)).toEqual({ from: "newer" })
      // Once the newer one is gone from the user's list, the older one serves.
      newer.c.ws.close()
      const mcp = yield* client(ws, "alice")
      yield* call(mcp, 2, "list_extensions").pipe(
        Effect.filterOrFail((m) => JSON.stringify(m.result) === JSON.stringify({ extensions: [{ id: older.id, name: "Chrome", connected: true }] })),
        Effect.retry(Schedule.spaced("50 millis")),
        Effect.timeout("5 seconds")
      )
      const second = yield* ask("alice", "createTab", { url: "https://example.com" })
      const fromOlder = yield* next(older.c)
      older.c.send({ jsonrpc: "2.0", id: fromOlder.id, result: { from: "older" } })
      expect(yield* Fiber.join(second)).toEqual({ from: "older" })
    }))

  it.live("works across NATS, with two router replicas sharing router.internal", () =>
    Effect.gen(function*() {
      const { servers } = yield* NatsServer
      const ns = namespace()
      const { ws, ask } = yield* start({}, busLayer(servers, ns))
      // Not acquireRelease: a replica built in an uninterruptible region could never be stopped.
      const other = yield* replica(Router.layer, servers, ns)
      yield* Effect.addFinalizer(() => other.stop)
      const ext = yield* extensionOf(ws, "alice")
      const calls = yield* Effect.forEach([1, 2, 3, 4], (n) => ask("alice", "createTab", { url: `https://example.com/${n}` }))
      for (let i = 0; i < calls.length; i++) {
        const asked = yield* next(ext.c)
        expect(asked.id).toMatch(PROXY_ID)
        ext.c.send({ jsonrpc: "2.0", id: asked.id, result: { echo: asked.params } })
      }
      const results = yield* Effect.forEach(calls, Fiber.join)
      expect(results).toEqual([1, 2, 3, 4].map((n) => ({ echo: { url: `https://example.com/${n}` } })))
      expect(yield* call(yield* client(ws, "alice"), 2, "list_extensions")).toMatchObject({ result: { extensions: [{ id: ext.id }] } })
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 120_000)

  it.scopedLive("an extension record a crash left behind is passed over for the next extension", () =>
    Effect.gen(function*() {
      const { ask, kv, ws } = yield* start()
      const live = yield* extensionOf(ws, "alice")
      // Newer than the live one, but no actor answers for its socket.
      const extensions = yield* kv.bucket(Subjects.Bucket.extensions)
      const stale = { id: "ext-stale", name: "Gone", user: "alice", conn: "00000000-0000-4000-8000-00000000dead", edge: "edge-gone", connectedAt: Date.now() + 60_000 }
      yield* extensions.put(Subjects.Key.userExtension("alice", stale.id), JSON.stringify(stale))
      const pending = yield* ask("alice", "createTab", { url: "https://example.com" })
      const asked = yield* next(live.c)
      expect(asked).toMatchObject({ method: "createTab", id: expect.stringMatching(PROXY_ID) })
      live.c.send({ jsonrpc: "2.0", id: asked.id, result: { tabId: 1 } })
      expect(yield* Fiber.join(pending)).toEqual({ tabId: 1 })
    }))
})
