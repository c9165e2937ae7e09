/**
 * `/hub` over Streamable HTTP: the same registry session the WebSocket `/hub` gets, driven by the
 * official SDK's unmodified `StreamableHTTPClientTransport` (and by plain fetch where a test needs
 * a header or a status the SDK hides). Any edge serves any session, SSE streams resume with
 * Last-Event-ID on another edge, and every refusal the spec names gets its status.
 */
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js"
import { ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js"
import { describe, expect, it } from "@effect/vitest"
import { Edge } from "@switchboard/edge"
import { Registry } from "@switchboard/registry"
import { Router } from "@switchboard/router"
import { NatsServer } from "@switchboard/testing"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import { STATUS_CODES } from "node:http"
import * as Processes from "./support/Processes.ts"
import { sseStream } from "./support/Sse.ts"
import { busLayer, namespace, stack, token } from "./support/Stack.ts"
import { hub, page, progressPage, tab, textOf, toolsUntil } from "./support/Tabs.ts"

const services = Layer.mergeAll(Router.layer, Registry.layer)
const urlOf = (ctx: Context.Context<Edge.EdgeServer>) => Context.get(ctx, Edge.EdgeServer).url
/** One edge with the router and the registry, embedded bus; its base URL. */
const start = (env: Record<string, string> = {}) => Effect.map(Layer.build(stack(busLayer(), { services, env })), urlOf)

const INIT = { jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "0" } } }
const BOTH = "application/json, text/event-stream"

/** The SDK's client over Streamable HTTP at `<base>/hub` as `user`; `fetch` may pick the edge per request. */
const httpHub = (base: string, user: string, fetchFn?: typeof fetch) =>
  Effect.acquireRelease(
    Effect.gen(function*() {
      const t = yield* token({ sub: user })
      const client = new Client({ name: "test-http-client", version: "0.0.0" })
      const changes = yield* Queue.unbounded<number>()
      client.setNotificationHandler(ToolListChangedNotificationSchema, () => void Queue.unsafeOffer(changes, Date.now()))
      const transport = new StreamableHTTPClientTransport(new URL(`${base}/hub`), {
        requestInit: { headers: { Authorization: `Bearer ${t}` } },
        ...(fetchFn === undefined ? {} : { fetch: fetchFn })
      })
      yield* Effect.promise(() => client.connect(transport))
      return { client, changes, transport, token: t }
    }),
    ({ client }) => Effect.promise(() => client.close())
  )

/** A plain fetch to `<base>/hub`. */
const raw = (base: string, init: RequestInit & { readonly headers?: Record<string, string> }, path = "/hub") =>
  Effect.promise(async () => {
    const res = await fetch(`${base}${path}`, init)
    const text = await res.text()
    return { status: res.status, headers: res.headers, text, json: (): unknown => JSON.parse(text) }
  })

/**
 * That `r` was refused with `status`, and says so in its JSON-RPC error: the status's reason
 * phrase, then (when given) why.
 */
const refusedWith = (r: { readonly status: number; readonly json: () => unknown }, status: number, why?: string) => {
  expect(r.status).toBe(status)
  expect(r.json()).toMatchObject({ jsonrpc: "2.0", id: null, error: { code: -32000, message: why === undefined ? STATUS_CODES[status] : `${STATUS_CODES[status]}: ${why}` } })
}

/** `initialize` by plain POST; the session id. */
const initialize = (base: string, t: string, protocolVersion = INIT.params.protocolVersion) =>
  Effect.gen(function*() {
    const body = JSON.stringify({ ...INIT, params: { ...INIT.params, protocolVersion } })
    const r = yield* raw(base, { method: "POST", headers: { authorization: `Bearer ${t}`, accept: BOTH, "content-type": "application/json" }, body })
    expect(r.status).toBe(200)
    const session = r.headers.get("mcp-session-id")
    if (session === null) return yield* Effect.dieMessage("initialize returned no Mcp-Session-Id")
    return session
  })

describe("/hub over Streamable HTTP", () => {
  it.scopedLive("the SDK client lists and calls a tab's tool through /hub (embedded bus)", () =>
    Effect.gen(function*() {
      const base = yield* start()
      yield* tab(base.replace("http", "ws"), page("shop", ["getCart", "addItem"]), { user: "alice", tabId: 1, url: "https://shop.example.com/cart" })
      const { client, transport } = yield* httpHub(base, "alice")
      expect(transport.sessionId).toMatch(/^[0-9a-f-]{36}$/)
      expect(client.getServerCapabilities()?.tools).toEqual({ listChanged: true })
      const tools = yield* toolsUntil(client, (n) => n.length === 2)
      expect(tools.map((t) => t.name).sort()).toEqual(["website_tool_shop_example_com_tab1_addItem", "website_tool_shop_example_com_tab1_getCart"])
      const result = yield* Effect.promise(() => client.callTool({ name: "website_tool_shop_example_com_tab1_getCart", arguments: { text: "now" } }))
      expect(textOf(result)).toBe("shop:getCart:now")
    }))

  it.scopedLive("DELETE ends the session, and its id is unknown from then on", () =>
    Effect.gen(function*() {
      const base = yield* start()
      const t = yield* token({ sub: "alice" })
      const session = yield* initialize(base, t)
      const headers = { authorization: `Bearer ${t}`, accept: BOTH, "content-type": "application/json", "mcp-session-id": session }
      const ping = JSON.stringify({ jsonrpc: "2.0", id: 2, method: "ping" })
      const before = yield* raw(base, { method: "POST", headers, body: ping })
      expect(before.status).toBe(200)
      expect(before.json()).toEqual({ jsonrpc: "2.0", id: 2, result: {} })
      const deleted = yield* raw(base, { method: "DELETE", headers: { authorization: `Bearer ${t}`, "mcp-session-id": session } })
      expect([200, 204]).toContain(deleted.status)
      expect((yield* raw(base, { method: "POST", headers, body: ping })).status).toBe(404)
    }))

  it.scopedLive("a user's sessions are capped: one more initialize gets 429 until one is deleted", () =>
    Effect.gen(function*() {
      const base = yield* start({ REGISTRY_MAX_HTTP_SESSIONS_PER_USER: "2" })
      const t = yield* token({ sub: "alice" })
      const first = yield* initialize(base, t)
      yield* initialize(base, t)
      const open = () =>
        raw(base, { method: "POST", headers: { authorization: `Bearer ${t}`, accept: BOTH, "content-type": "application/json" }, body: JSON.stringify(INIT) })
      const refused = yield* open()
      expect(refused.status).toBe(429)
      expect(refused.json()).toMatchObject({ error: { message: expect.stringContaining("too many Streamable HTTP sessions for this user (at most 2)") } })
      // Another user is not held back by alice's sessions.
      yield* initialize(base, yield* token({ sub: "bob" }))
      const deleted = yield* raw(base, { method: "DELETE", headers: { authorization: `Bearer ${t}`, "mcp-session-id": first } })
      expect(deleted.status).toBe(204)
      // The session's actor ends a moment after the 204, and gives its seat back then.
      const again = yield* open().pipe(
        Effect.filterOrFail((r) => r.status === 200, (r) => r.status),
        Effect.retry(Schedule.spaced("20 millis").pipe(Schedule.upTo("5 seconds")))
      )
      expect(again.headers.get("mcp-session-id")).toMatch(/^[0-9a-f-]{36}$/)
    }))

  it.scopedLive("every refusal has the spec's status", () =>
    Effect.gen(function*() {
      const base = yield* start({ ALLOWED_ORIGINS: "https://app.example.com", EDGE_HTTP_MAX_BODY: "1024" })
      const t = yield* token({ sub: "alice" })
      const auth = { authorization: `Bearer ${t}` }
      const post = (headers: Record<string, string>, body: string) => raw(base, { method: "POST", headers, body })
      const json = { ...auth, accept: BOTH, "content-type": "application/json" }
      const session = yield* initialize(base, t)

      // 400: no session id on a request other than initialize; an unsupported protocol version; invalid JSON.
      refusedWith(yield* post(json, JSON.stringify({ jsonrpc: "2.0", id: 2, method: "tools/list" })), 400, "Mcp-Session-Id header is required (send initialize first)")
      refusedWith(
        yield* post({ ...json, "mcp-session-id": session, "mcp-protocol-version": "1999-01-01" }, JSON.stringify({ jsonrpc: "2.0", id: 2, method: "ping" })),
        400,
        "unsupported MCP-Protocol-Version 1999-01-01 (supported: 2025-11-25, 2025-06-18, 2025-03-26)"
      )
      const bad = yield* post({ ...json, "mcp-session-id": session }, "{not json")
      expect(bad.status).toBe(400)
      expect(bad.json()).toMatchObject({ jsonrpc: "2.0", id: null, error: { code: -32700 } })
      // A version the spec lists is fine, and so is none (taken as 2025-03-26).
      expect((yield* post({ ...json, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25" }, JSON.stringify({ jsonrpc: "2.0", id: 3, method: "ping" }))).status).toBe(200)

      // 401, with where to find the authorization server.
      const anonymous = yield* post({ accept: BOTH, "content-type": "application/json" }, JSON.stringify(INIT))
      refusedWith(anonymous, 401, "a bearer token is required (Authorization header)")
      const host = new URL(base).host
      expect(anonymous.headers.get("www-authenticate")).toBe(`Bearer resource_metadata="http://${host}/.well-known/oauth-protected-resource"`)
      const forged = yield* post({ ...json, authorization: "Bearer not-a-token" }, JSON.stringify(INIT))
      expect(forged.status).toBe(401)
      expect(forged.json()).toMatchObject({ error: { message: expect.stringMatching(/^Unauthorized: invalid token: /) } })
      expect(forged.headers.get("www-authenticate")).toContain(`resource_metadata="http://${host}/.well-known/oauth-protected-resource"`)

      // 403: a foreign page; an allowed one gets through.
      refusedWith(yield* post({ ...json, origin: "https://evil.example.net" }, JSON.stringify(INIT)), 403, "origin https://evil.example.net is not allowed")
      expect((yield* post({ ...json, origin: "https://app.example.com" }, JSON.stringify(INIT))).status).toBe(200)

      // 404: a session nobody opened, and another user's, which looks no different.
      const unknown = "00000000-0000-4000-8000-000000000000"
      expect((yield* post({ ...json, "mcp-session-id": unknown }, JSON.stringify({ jsonrpc: "2.0", id: 2, method: "ping" }))).status).toBe(404)
      const bob = yield* token({ sub: "bob" })
      expect((yield* post({ ...json, authorization: `Bearer ${bob}`, "mcp-session-id": session }, JSON.stringify({ jsonrpc: "2.0", id: 2, method: "ping" }))).status).toBe(404)
      expect((yield* raw(base, { method: "GET", headers: { authorization: `Bearer ${bob}`, accept: "text/event-stream", "mcp-session-id": session } })).status).toBe(404)

      // 405, naming what is allowed.
      const put = yield* raw(base, { method: "PUT", headers: json, body: "{}" })
      refusedWith(put, 405)
      expect(put.headers.get("allow")).toBe("GET, POST, DELETE")

      // 406: a POST must accept JSON and SSE; a GET must accept SSE.
      refusedWith(yield* post({ ...json, accept: "application/json" }, JSON.stringify(INIT)), 406, "a POST must accept both application/json and text/event-stream")
      refusedWith(yield* raw(base, { method: "GET", headers: { ...auth, accept: "application/json", "mcp-session-id": session } }), 406, "a GET must accept text/event-stream")

      // 413 and 415.
      const big = yield* post({ ...json, "mcp-session-id": session }, JSON.stringify({ jsonrpc: "2.0", id: 4, method: "ping", params: { pad: "x".repeat(2048) } }))
      refusedWith(big, 413, "a message may have at most 1024 bytes")
      refusedWith(yield* post({ ...json, "content-type": "text/plain" }, JSON.stringify(INIT)), 415, "the body must be application/json")

      // The protected resource metadata (RFC 9728), without an issuer configured.
      const meta = yield* raw(base, { method: "GET" }, "/.well-known/oauth-protected-resource")
      expect(meta.status).toBe(200)
      expect(meta.json()).toEqual({ resource: `http://${host}/hub`, bearer_methods_supported: ["header"] })
    }))

  it.scopedLive("the protected resource metadata names SWITCHBOARD_JWT_ISSUER and EDGE_PUBLIC_URL when they are set", () =>
    Effect.gen(function*() {
      const base = yield* start({ SWITCHBOARD_JWT_ISSUER: "https://issuer.example.com", EDGE_PUBLIC_URL: "https://mcp.example.com/" })
      const meta = yield* raw(base, { method: "GET" }, "/.well-known/oauth-protected-resource")
      expect(meta.json()).toEqual({
        resource: "https://mcp.example.com/hub",
        authorization_servers: ["https://issuer.example.com"],
        bearer_methods_supported: ["header"]
      })
      const anonymous = yield* raw(base, { method: "POST", headers: { accept: BOTH, "content-type": "application/json" }, body: JSON.stringify(INIT) })
      expect(anonymous.headers.get("www-authenticate")).toBe(`Bearer resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource"`)
    }))

  it.scopedLive("progress arrives over SSE before the result, and list_changed on the GET stream", () =>
    Effect.gen(function*() {
      const base = yield* start()
      const ws = base.replace("http", "ws")
      const server = progressPage()
      yield* tab(ws, server, { user: "alice", tabId: 1, url: "https://work.example.com/" })
      const { changes, client } = yield* httpHub(base, "alice")
      yield* toolsUntil(client, (n) => n.length === 1)
      const progress: Array<number> = []
      const done = yield* Effect.promise(() =>
        client.callTool({ name: "website_tool_work_example_com_tab1_long", arguments: { steps: 2 } }, undefined, { onprogress: (p) => void progress.push(p.progress) })
      )
      expect(textOf(done)).toBe("done 2")
      expect(progress).toEqual([1, 2])

      // The SDK opened its GET stream after initialize; list_changed arrives there, unasked.
      yield* tab(ws, page("docs", ["search"]), { user: "alice", tabId: 9, url: "https://docs.example.org/" })
      yield* Queue.take(changes).pipe(Effect.timeout("10 seconds"), Effect.orDie)
      yield* toolsUntil(client, (n) => n.length === 2)
    }))

  it.scopedLive("a GET stream is answered once it is attached: a change right after the 200 arrives, and 2025-11-25 clients get a priming id to resume from", () =>
    Effect.gen(function*() {
      const base = yield* start()
      const ws = base.replace("http", "ws")
      const t = yield* token({ sub: "alice" })
      for (const [version, tabId] of [["2025-06-18", 1], ["2025-11-25", 2]] as const) {
        const session = yield* initialize(base, t, version)
        const headers = { authorization: `Bearer ${t}`, accept: BOTH, "content-type": "application/json", "mcp-session-id": session, "mcp-protocol-version": version }
        // A change is news only against a list the session has.
        expect((yield* raw(base, { method: "POST", headers, body: JSON.stringify({ jsonrpc: "2.0", id: 2, method: "tools/list" }) })).status).toBe(200)
        const stream = yield* sseStream(base, t, session, version)
        yield* tab(ws, page(`v${tabId}`, ["t"]), { user: "alice", tabId, url: `https://v${tabId}.example.com/` })
        const first = yield* stream.next
        if (version === "2025-06-18") {
          // Older clients would take empty data for a message: no priming event for them.
          expect(JSON.parse(first.data)).toEqual({ jsonrpc: "2.0", method: "notifications/tools/list_changed" })
          continue
        }
        expect(first).toEqual({ id: expect.any(String), data: "" })
        const change = yield* stream.next
        expect(JSON.parse(change.data)).toEqual({ jsonrpc: "2.0", method: "notifications/tools/list_changed" })
        // Resuming from the priming id replays the change the stream had after it.
        const resumed = yield* sseStream(base, t, session, version, first.id)
        expect(yield* resumed.next).toEqual({ id: first.id, data: "" })
        expect(yield* resumed.next).toEqual(change)
        yield* stream.ended
      }
    }))
})

describe("/hub over Streamable HTTP across edges (NATS)", () => {
  /** Edge A with the registry and router, and edge B alone, on one NATS. */
  const twoEdges = Effect.gen(function*() {
    const { url } = yield* NatsServer
    const ns = namespace()
    const a = urlOf(yield* Layer.build(stack(busLayer([url], ns), { services })))
    const b = urlOf(yield* Layer.build(stack(busLayer([url], ns))))
    return { a, b }
  })

  it.scopedLive("initialize on edge A, every later request on edge B", () =>
    Effect.gen(function*() {
      const { a, b } = yield* twoEdges
      yield* tab(a.replace("http", "ws"), page("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/cart" })
      const seen: Array<string> = []
      let first = true
      // The session starts on A; everything after goes to B, as a load balancer without stickiness may do.
      const split: typeof fetch = (input, init) => {
        const target = new URL(input instanceof Request ? input.url : input.toString())
        const edge = new URL(first ? a : b)
        first = false
        target.host = edge.host
        seen.push(`${init?.method ?? "GET"} ${target.host}`)
        return fetch(target, init)
      }
      const { client } = yield* httpHub(a, "alice", split)
      yield* toolsUntil(client, (n) => n.length === 1)
      expect(textOf(yield* Effect.promise(() => client.callTool({ name: "website_tool_shop_example_com_tab1_getCart", arguments: { text: "b" } })))).toBe("shop:getCart:b")
      expect(seen[0]).toBe(`POST ${new URL(a).host}`)
      expect(seen.slice(1).every((s) => s.endsWith(new URL(b).host))).toBe(true)
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 120_000)

  it.scopedLive("the SDK client's GET stream, cut by killing its edge, resumes with Last-Event-ID on another edge and replays what was pushed meanwhile", () =>
    Effect.gen(function*() {
      const { url } = yield* NatsServer
      const ns = namespace()
      const a = urlOf(yield* Layer.build(stack(busLayer([url], ns), { services })))
      // Edge B is a process of its own, so that it can die as a crashed pod does: SIGKILL, no goodbye.
      const edgeB = yield* Processes.edge({ natsUrl: url, namespace: ns })
      const ws = a.replace("http", "ws")

      // The load balancer: POSTs go to A; the GET stream goes to B while B lives, and to A after,
      // but only once `reopen` is done, so that what is pushed meanwhile can only arrive by replay.
      let bAlive = true
      const reopen = yield* Deferred.make<void>()
      // The SDK opens its GET stream on its own, after initialize: a change pushed before the
      // session has the stream is kept only for a stream that resumes, so the test waits for it.
      const streamOpen = yield* Deferred.make<void>()
      const gets: Array<{ readonly host: string; readonly lastEventId: string | null; readonly status: number }> = []
      const balance: typeof fetch = async (input, init) => {
        const target = new URL(input instanceof Request ? input.url : input.toString())
        const get = (init?.method ?? "GET") === "GET"
        if (get && !bAlive) await Effect.runPromise(Deferred.await(reopen))
        target.host = new URL(get && bAlive ? edgeB.url : a).host
        const res = await fetch(target, init)
        if (get) {
          gets.push({ host: target.host, lastEventId: new Headers(init?.headers).get("last-event-id"), status: res.status })
          Deferred.unsafeDone(streamOpen, Exit.void)
        }
        return res
      }
      const { client, changes } = yield* httpHub(a, "alice", balance)
      // A change is news only against a list the session has: this one is empty.
      yield* toolsUntil(client, (n) => n.length === 0)
      yield* Deferred.await(streamOpen).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("the SDK opened no GET stream") }), Effect.orDie)
      yield* tab(ws, page("one", ["first"]), { user: "alice", tabId: 1, url: "https://one.example.com/" })
      // Only the GET stream carries list_changed: every POST here is answered with JSON.
      yield* Queue.take(changes).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error(`no list_changed on the stream to B; GETs: ${JSON.stringify(gets)}`) }), Effect.orDie)
      expect(gets).toEqual([{ host: new URL(edgeB.url).host, lastEventId: null, status: 200 }])

      bAlive = false
      expect((yield* Effect.zipRight(edgeB.kill("SIGKILL"), edgeB.exited)).signal).toBe("SIGKILL")
      // A WebSocket session of the same user on the same replica hears the next change when ours does.
      const observer = yield* hub(ws, "alice")
      const heard = observer.changes.length
      yield* tab(ws, page("two", ["second"]), { user: "alice", tabId: 2, url: "https://two.example.com/" })
      yield* Effect.suspend(() => (observer.changes.length > heard ? Effect.void : Effect.fail("not yet"))).pipe(
        Effect.retry(Schedule.spaced("10 millis")),
        Effect.timeout("10 seconds"),
        Effect.orDie
      )
      // Our session's mailbox took its wake before this ping: once answered, the change was pushed, to no stream.
      yield* Effect.promise(() => client.ping())
      expect(yield* Queue.size(changes)).toBe(0)

      yield* Deferred.succeed(reopen, undefined)
      yield* Queue.take(changes).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error(`no replay; GETs: ${JSON.stringify(gets)}`) }), Effect.orDie)
      expect(gets).toHaveLength(2)
      expect(gets[1]?.host).toBe(new URL(a).host)
      expect(gets[1]?.lastEventId).toBeTruthy()
      yield* toolsUntil(client, (n) => n.length === 2)
      expect(textOf(yield* Effect.promise(() => client.callTool({ name: "website_tool_two_example_com_tab2_second", arguments: { text: "x" } })))).toBe("two:second:x")
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 120_000)
})
