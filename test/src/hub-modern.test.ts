/**
 * `/hub` in MCP 2026-07-28, the modern era: no session, every request on its own, driven by the
 * official SDK v2 client (`@modelcontextprotocol/client`, unmodified) and by plain fetch where a
 * test needs a header or a status the SDK hides. The SDK v1 client on the legacy era works beside
 * it at the same URL.
 */
import { Client as ModernClient, StreamableHTTPClientTransport as ModernTransport } from "@modelcontextprotocol/client"
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js"
import { describe, expect, it } from "@effect/vitest"
import { Edge } from "@switchboard/edge"
import { Modern } from "@switchboard/protocol"
import { Registry } from "@switchboard/registry"
import { Router } from "@switchboard/router"
import { NatsServer } from "@switchboard/testing"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Queue from "effect/Queue"
import type * as Scope from "effect/Scope"
import { modernMeta, modernPost } from "./support/Modern.ts"
import * as Processes from "./support/Processes.ts"
import { busLayer, stack, token } from "./support/Stack.ts"
import { page, progressPage, tab, textOf, toolsUntil } from "./support/Tabs.ts"

const services = Layer.mergeAll(Router.layer, Registry.layer)
/** One edge with the router and the registry, embedded bus; its base URL. */
const start = (env: Record<string, string> = {}) => Effect.map(Layer.build(stack(busLayer(), { services, env })), (ctx) => Context.get(ctx, Edge.EdgeServer).url)

const V = "2026-07-28"

/** The SDK v2 client at `<base>/hub` as `user`, pinned to the modern era: no fallback, anything else fails. */
const modernHub = (base: string, user: string) =>
  Effect.acquireRelease(
    Effect.gen(function*() {
      const t = yield* token({ sub: user })
      const client = new ModernClient({ name: "test-modern-client", version: "0.0.0" }, { versionNegotiation: { mode: { pin: V } } })
      const changes = yield* Queue.unbounded<number>()
      client.setNotificationHandler("notifications/tools/list_changed", () => void Queue.unsafeOffer(changes, Date.now()))
      yield* Effect.promise(() => client.connect(new ModernTransport(new URL(`${base}/hub`), { requestInit: { headers: { Authorization: `Bearer ${t}` } } })))
      return { client, changes, token: t }
    }),
    ({ client }) => Effect.promise(() => client.close())
  )

/** Polls the modern client's `tools/list` until `ok` holds of the names. */
const modernToolsUntil = (client: ModernClient, ok: (names: ReadonlyArray<string>) => boolean) =>
  Effect.gen(function*() {
    const started = Date.now()
    for (;;) {
      const { tools } = yield* Effect.promise(() => client.listTools())
      const names = tools.map((t) => t.name)
      if (ok(names)) return tools
      if (Date.now() - started > 5_000) return yield* Effect.dieMessage(`tools/list never matched; last: ${JSON.stringify(names)}`)
      yield* Effect.sleep("10 millis")
    }
  })

const meta = modernMeta()

/** A plain modern POST to `<base>/hub`: headers mirror the body unless `headers` says otherwise. */
const post = (base: string, t: string | undefined, body: Record<string, unknown>, headers: Record<string, string> = {}) => modernPost(base, body, { token: t, headers })

describe("/hub, MCP 2026-07-28", () => {
  it.scopedLive("the SDK v2 client discovers 2026-07-28, lists and calls a tab's tool with progress, with no session anywhere", () =>
    Effect.gen(function*() {
      const base = yield* start()
      const ws = base.replace("http", "ws")
      yield* tab(ws, progressPage(), { user: "alice", tabId: 1, url: "https://work.example.com/" })
      yield* tab(ws, page("shop", ["getCart"]), { user: "bob", tabId: 2, url: "https://shop.example.com/" })
      const { client } = yield* modernHub(base, "alice")
      expect(client.getProtocolEra()).toBe("modern")
      expect(client.getNegotiatedProtocolVersion()).toBe(V)
      expect(client.getDiscoverResult()).toMatchObject({ supportedVersions: expect.arrayContaining([V, "2025-11-25"]), capabilities: { tools: { listChanged: true } } })
      // Alice sees her tab's tool, and not Bob's.
      expect((yield* modernToolsUntil(client, (n) => n.length === 1)).map((t) => t.name)).toEqual(["website_tool_work_example_com_tab1_long"])
      const progress: Array<number> = []
      const done = yield* Effect.promise(() =>
        client.callTool({ name: "website_tool_work_example_com_tab1_long", arguments: { steps: 2 } }, { onprogress: (p) => void progress.push(p.progress) })
      )
      expect(textOf(done)).toBe("done 2")
      expect(progress).toEqual([1, 2])
    }))

  it.scopedLive("results carry resultType, serverInfo and, for tools/list, a private ttl; no response names a session", () =>
    Effect.gen(function*() {
      const base = yield* start()
      const ws = base.replace("http", "ws")
      yield* tab(ws, page("shop", ["getCart", "addItem"]), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      const t = yield* token({ sub: "alice" })
      const discover = yield* post(base, t, { jsonrpc: "2.0", id: "d", method: "server/discover", params: { _meta: meta } })
      expect(discover.status).toBe(200)
      expect(discover.headers.get("mcp-session-id")).toBeNull()
      expect(discover.json()).toMatchObject({ id: "d", result: { resultType: "complete", supportedVersions: [V, "2025-11-25", "2025-06-18", "2025-03-26"], _meta: { [Modern.Meta.serverInfo]: Modern.ServerInfo } } })
      let list = yield* post(base, t, { jsonrpc: "2.0", id: 1, method: "tools/list", params: { _meta: meta } })
      for (let i = 0; i < 100 && (list.json()["result"] as { tools: Array<unknown> }).tools.length < 2; i++) {
        yield* Effect.sleep("20 millis")
        list = yield* post(base, t, { jsonrpc: "2.0", id: 1, method: "tools/list", params: { _meta: meta } })
      }
      expect(list.headers.get("mcp-session-id")).toBeNull()
      const result = list.json()["result"] as Record<string, unknown>
      expect(result).toMatchObject({ resultType: "complete", ttlMs: Modern.ToolsListTtlMillis, cacheScope: "private", _meta: { [Modern.Meta.serverInfo]: Modern.ServerInfo } })
      // A deterministic order: the same list twice is the same text.
      const again = yield* post(base, t, { jsonrpc: "2.0", id: 1, method: "tools/list", params: { _meta: meta } })
      expect(again.text).toBe(list.text)
      const name = "website_tool_shop_example_com_tab1_getCart"
      const call = yield* post(base, t, { jsonrpc: "2.0", id: 2, method: "tools/call", params: { name, arguments: { text: "x" }, _meta: meta } })
      expect(call.json()).toMatchObject({ id: 2, result: { resultType: "complete", content: [{ type: "text", text: "shop:getCart:x" }], _meta: { [Modern.Meta.serverInfo]: Modern.ServerInfo } } })
    }))

  it.scopedLive("a subscriptions/listen stream is acknowledged first, then hears every change of the user's tools, and no one else's", () =>
    Effect.gen(function*() {
      const base = yield* start()
      const ws = base.replace("http", "ws")
      const alice = yield* modernHub(base, "alice")
      const subscription = yield* Effect.promise(() => alice.client.listen({ toolsListChanged: true, promptsListChanged: true }))
      // Only what the hub can honor.
      expect(subscription.honoredFilter).toEqual({ toolsListChanged: true })
      // Bob's tab tells Alice nothing; hers does, with no tools/list in between.
      const bob = yield* modernHub(base, "bob")
      const bobs = yield* Effect.promise(() => bob.client.listen({ toolsListChanged: true }))
      yield* tab(ws, page("bob", ["x"]), { user: "bob", tabId: 1, url: "https://b.example.com/" })
      yield* Queue.take(bob.changes).pipe(Effect.timeout("10 seconds"), Effect.orDie)
      expect(yield* Queue.size(alice.changes)).toBe(0)
      yield* Effect.promise(() => bobs.close())
      yield* tab(ws, page("shop", ["getCart"]), { user: "alice", tabId: 2, url: "https://shop.example.com/" })
      yield* Queue.take(alice.changes).pipe(Effect.timeout("10 seconds"), Effect.orDie)
      expect((yield* modernToolsUntil(alice.client, (n) => n.length === 1)).map((t) => t.name)).toEqual(["website_tool_shop_example_com_tab2_getCart"])
      // A tab that closes is a change too.
      const closing = yield* tab(ws, page("docs", ["search"]), { user: "alice", tabId: 3, url: "https://docs.example.org/" })
      yield* Queue.take(alice.changes).pipe(Effect.timeout("10 seconds"), Effect.orDie)
      yield* Queue.takeAll(alice.changes)
      closing.socket.terminate()
      yield* Queue.take(alice.changes).pipe(Effect.timeout("10 seconds"), Effect.orDie)
      yield* modernToolsUntil(alice.client, (n) => n.length === 1)
      yield* Effect.promise(() => subscription.close())
    }))

  it.scopedLive("closing a call's stream cancels the call, and the page sees the abort", () =>
    Effect.gen(function*() {
      const base = yield* start()
      const ws = base.replace("http", "ws")
      const started = yield* Deferred.make<void>()
      const aborted = yield* Deferred.make<string>()
      const server = progressPage((_steps, extra) =>
        new Promise<void>((resolve) => {
          Deferred.unsafeDone(started, Effect.void)
          extra.signal.addEventListener("abort", () => {
            Deferred.unsafeDone(aborted, Effect.succeed(String(extra.signal.reason)))
            resolve()
          })
        })
      )
      yield* tab(ws, server, { user: "alice", tabId: 1, url: "https://work.example.com/" })
      const { client } = yield* modernHub(base, "alice")
      yield* modernToolsUntil(client, (n) => n.length === 1)
      const controller = new AbortController()
      const call = client.callTool({ name: "website_tool_work_example_com_tab1_long", arguments: { steps: 1 } }, { signal: controller.signal }).then(
        () => "answered",
        () => "rejected"
      )
      yield* Deferred.await(started).pipe(Effect.timeout("10 seconds"), Effect.orDie)
      controller.abort()
      expect(yield* Effect.promise(() => call)).toBe("rejected")
      expect(yield* Deferred.await(aborted).pipe(Effect.timeout("10 seconds"), Effect.orDie)).toContain("closed the request's stream")
    }))

  it.scopedLive("every refusal has the specification's status and code", () =>
    Effect.gen(function*() {
      const base = yield* start()
      const t = yield* token({ sub: "alice" })
      const list = { jsonrpc: "2.0", id: 1, method: "tools/list", params: { _meta: meta } }
      const errorOf = (r: { readonly status: number; readonly json: () => Record<string, unknown> }) => [r.status, (r.json()["error"] as { code: number }).code]

      const unsupported = yield* post(base, t, { ...list, params: { _meta: { ...meta, [Modern.Meta.protocolVersion]: "2099-01-01" } } }, { "mcp-protocol-version": "2099-01-01" })
      expect(errorOf(unsupported)).toEqual([400, -32022])
      expect(unsupported.json()["error"]).toMatchObject({ data: { supported: [V, "2025-11-25", "2025-06-18", "2025-03-26"], requested: "2099-01-01" } })
      expect(errorOf(yield* post(base, t, list, { "mcp-protocol-version": "2025-06-18" }))).toEqual([400, -32020])
      expect(errorOf(yield* post(base, t, list, { "mcp-method": "tools/call" }))).toEqual([400, -32020])
      const call = { jsonrpc: "2.0", id: 2, method: "tools/call", params: { name: "x_y", arguments: {}, _meta: meta } }
      expect(errorOf(yield* post(base, t, call, { "mcp-name": "other" }))).toEqual([400, -32020])
      expect(errorOf(yield* post(base, t, { ...list, params: { _meta: { [Modern.Meta.protocolVersion]: V } } }))).toEqual([400, -32602])
      expect(errorOf(yield* post(base, t, { jsonrpc: "2.0", id: 3, method: "prompts/list", params: { _meta: meta } }))).toEqual([404, -32601])
      // A tool this user has never had: a JSON-RPC error in a 200, as any tool error.
      expect(errorOf(yield* post(base, t, call))).toEqual([200, -32602])

      const anonymous = yield* post(base, undefined, list)
      expect(anonymous.status).toBe(401)
      expect(anonymous.headers.get("www-authenticate")).toContain("resource_metadata=")
      expect((yield* post(base, `${t}x`, list)).status).toBe(401)
      expect((yield* post(base, t, list, { origin: "https://evil.example" })).status).toBe(403)
      const big = yield* post(base, t, { ...list, params: { _meta: meta, pad: "x".repeat(5 * 1024 * 1024) } })
      expect(big.status).toBe(413)
      // A notification is taken and needs nothing.
      expect((yield* post(base, t, { jsonrpc: "2.0", method: "notifications/cancelled", params: { requestId: 1, _meta: meta } })).status).toBe(202)
    }))

  it.scopedLive("the SDK v1 client on the legacy era works beside it at the same URL", () =>
    Effect.gen(function*() {
      const base = yield* start()
      const ws = base.replace("http", "ws")
      yield* tab(ws, page("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      const t = yield* token({ sub: "alice" })
      const legacy = new Client({ name: "test-v1-client", version: "0.0.0" })
      yield* Effect.acquireRelease(
        Effect.promise(() => legacy.connect(new StreamableHTTPClientTransport(new URL(`${base}/hub`), { requestInit: { headers: { Authorization: `Bearer ${t}` } } }))),
        () => Effect.promise(() => legacy.close())
      )
      const { client } = yield* modernHub(base, "alice")
      yield* modernToolsUntil(client, (n) => n.length === 1)
      const [a, b] = yield* Effect.all([
        Effect.promise(() => legacy.callTool({ name: "website_tool_shop_example_com_tab1_getCart", arguments: { text: "v1" } })),
        Effect.promise(() => client.callTool({ name: "website_tool_shop_example_com_tab1_getCart", arguments: { text: "v2" } }))
      ], { concurrency: 2 })
      expect([textOf(a), textOf(b)]).toEqual(["shop:getCart:v1", "shop:getCart:v2"])
    }))
})

describe("/hub, MCP 2026-07-28, across processes (NATS, two edges, two registry replicas)", () => {
  const deploy = Effect.gen(function*() {
    const { url } = yield* NatsServer
    const { edges: [a, b] } = yield* Processes.deployment(url, { edges: 2, registry: true, registries: 2 })
    if (a === undefined || b === undefined) return yield* Effect.dieMessage("the deployment has fewer than two edges")
    return { a, b }
  })
  /** Each test gets a NATS of its own, and its processes stop before their NATS does. */
  const withNats = <A, E>(test: Effect.Effect<A, E, NatsServer | Scope.Scope>) => Effect.scoped(test).pipe(Effect.provide(NatsServer.layer))

  it.live("a client on edge A lists and calls tabs on edge B with progress (and the SDK v1 client beside it negotiates 2025-11-25 and does the same), hears list_changed on its listen stream when a tab registers through B, and cancels by closing a call's stream", () =>
    Effect.gen(function*() {
      const { a, b } = yield* deploy
      const started = yield* Deferred.make<void>()
      const aborted = yield* Deferred.make<string>()
      const server = progressPage((steps, extra) =>
        steps < 100 ? Promise.resolve() : new Promise<void>((resolve) => {
          Deferred.unsafeDone(started, Effect.void)
          extra.signal.addEventListener("abort", () => {
            Deferred.unsafeDone(aborted, Effect.succeed(String(extra.signal.reason)))
            resolve()
          })
        })
      )
      yield* tab(b.ws, server, { user: "alice", tabId: 1, url: "https://work.example.com/" })
      const { changes, client } = yield* modernHub(a.url, "alice")
      expect(client.getProtocolEra()).toBe("modern")
      yield* modernToolsUntil(client, (n) => n.length === 1)
      // Several calls: the queue group gives each to either replica, and each answers on edge A's exchange.
      for (let i = 0; i < 4; i++) {
        const progress: Array<number> = []
        const done = yield* Effect.promise(() =>
          client.callTool({ name: "website_tool_work_example_com_tab1_long", arguments: { steps: 2 } }, { onprogress: (p) => void progress.push(p.progress) })
        )
        expect([textOf(done), progress]).toEqual(["done 2", [1, 2]])
      }
      // The unmodified SDK v1 client in the same run: it negotiates 2025-11-25, a session the replicas hold, and calls the same tab.
      const v1 = new StreamableHTTPClientTransport(new URL(`${a.url}/hub`), { requestInit: { headers: { Authorization: `Bearer ${yield* token({ sub: "alice" })}` } } })
      const legacy = new Client({ name: "test-v1-client", version: "0.0.0" })
      yield* Effect.acquireRelease(Effect.promise(() => legacy.connect(v1)), () => Effect.promise(() => legacy.close()))
      expect(v1.protocolVersion).toBe("2025-11-25")
      expect((yield* toolsUntil(legacy, (n) => n.length === 1)).map((t) => t.name)).toEqual(["website_tool_work_example_com_tab1_long"])
      expect(textOf(yield* Effect.promise(() => legacy.callTool({ name: "website_tool_work_example_com_tab1_long", arguments: { steps: 1 } })))).toBe("done 1")

      yield* Effect.promise(() => client.listen({ toolsListChanged: true }))
      yield* tab(b.ws, page("docs", ["search"]), { user: "alice", tabId: 9, url: "https://docs.example.org/" })
      yield* Queue.take(changes).pipe(Effect.timeout("10 seconds"), Effect.orDie)
      yield* modernToolsUntil(client, (n) => n.length === 2)

      const controller = new AbortController()
      const call = client.callTool({ name: "website_tool_work_example_com_tab1_long", arguments: { steps: 100 } }, { signal: controller.signal }).then(
        () => "answered",
        () => "rejected"
      )
      yield* Deferred.await(started).pipe(Effect.timeout("20 seconds"), Effect.orDie)
      controller.abort()
      expect(yield* Effect.promise(() => call)).toBe("rejected")
      expect(yield* Deferred.await(aborted).pipe(Effect.timeout("10 seconds"), Effect.orDie)).toContain("closed the request's stream")
    }).pipe(withNats), 120_000)
})
