/**
 * The MCP-B tool registry over real sockets (embedded bus): tabs are real MCP servers behind a test
 * bridge at `/tabs`, and the client is the official SDK's `Client` over its WebSocket transport at
 * `/hub`. Naming, routing, caching, isolation and the spec's edge cases; registry-distributed.test.ts
 * runs the same service across NATS and OS processes.
 */
import type { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { describe, expect, it } from "@effect/vitest"
import { Kv, Subjects } from "@switchboard/bus"
import { Registry as RegistryProtocol } from "@switchboard/protocol"
import { Edge } from "@switchboard/edge"
import { Registry } from "@switchboard/registry"
import { Router } from "@switchboard/router"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import { closedWith, connect } from "./support/Client.ts"
import { extensionOf, next } from "./support/ProxyPeers.ts"
import { busLayer, expiredToken, stack, token } from "./support/Stack.ts"
import { hub, page, progressPage, rawHub, tab, textOf, toolsUntil } from "./support/Tabs.ts"
import { until } from "./support/Until.ts"

const build = (env: Record<string, string> = {}) => Layer.build(stack(busLayer(), { services: Layer.mergeAll(Router.layer, Registry.layer), env }))
const wsOf = (ctx: Context.Context<Edge.EdgeServer>) => Context.get(ctx, Edge.EdgeServer).url.replace("http", "ws")
const start = (env: Record<string, string> = {}) => Effect.map(build(env), wsOf)

/** A promise the test opens when it wants. */
const gate = () => {
  let open!: () => void
  const promise = new Promise<void>((resolve) => (open = resolve))
  return { promise, open }
}

const call = (client: Client, name: string, text = "") => Effect.promise(() => client.callTool({ name, arguments: { text } }))
const callError = (client: Client, name: string) =>
  Effect.promise(() => client.callTool({ name, arguments: {} }).then(() => undefined, (e: unknown) => e as { code: number; message: string }))

describe("MCP-B tool registry", () => {
  it.scopedLive("the SDK client lists two tabs' tools, calls one, and hears list_changed when a third registers", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      yield* tab(ws, page("shop", ["getCart", "addItem"]), { user: "alice", tabId: 1, url: "https://shop.example.com/cart" })
      yield* tab(ws, page("dev", ["build"]), { user: "alice", tabId: 7, url: "http://localhost:3000/" })
      const { changes, client } = yield* hub(ws, "alice")
      expect(client.getServerCapabilities()?.tools).toEqual({ listChanged: true })

      const tools = yield* toolsUntil(client, (n) => n.length === 3)
      expect(tools.map((t) => t.name).sort()).toEqual([
        "website_tool_localhost_3000_tab7_build",
        "website_tool_shop_example_com_tab1_addItem",
        "website_tool_shop_example_com_tab1_getCart"
      ])
      const getCart = tools.find((t) => t.name.endsWith("getCart"))!
      expect(getCart.description).toContain("shop.example.com")
      expect(getCart.description).toContain("tab 1")
      expect(getCart.description).toContain("getCart on shop")
      expect(getCart.inputSchema).toMatchObject({ type: "object", properties: { text: { type: "string" } } })

      expect(textOf(yield* call(client, "website_tool_localhost_3000_tab7_build", "now"))).toBe("dev:build:now")

      const before = changes.length
      yield* tab(ws, page("docs", ["search"]), { user: "alice", tabId: 9, url: "https://docs.example.org/" })
      yield* toolsUntil(client, (n) => n.includes("website_tool_docs_example_org_tab9_search"))
      yield* until(() => changes.length > before, "list_changed after the third tab")
    }))

  it.scopedLive("the same tool in two tabs is listed per tab, and each name reaches its own tab", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const one = yield* tab(ws, page("one", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      const two = yield* tab(ws, page("two", ["getCart"]), { user: "alice", tabId: 2, url: "https://shop.example.com/other" })
      const { client } = yield* hub(ws, "alice")
      yield* toolsUntil(client, (n) => n.length === 2)
      expect(textOf(yield* call(client, "website_tool_shop_example_com_tab2_getCart"))).toBe("two:getCart:")
      expect(textOf(yield* call(client, "website_tool_shop_example_com_tab1_getCart"))).toBe("one:getCart:")
      expect(one.executed.map((e) => e.toolName)).toEqual(["getCart"])
      expect(two.executed.map((e) => e.toolName)).toEqual(["getCart"])
    }))

  it.scopedLive("a cached tool runs in the domain's active tab, and follows an active-tab switch", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const three = yield* tab(ws, page("three", ["search"], { cache: true }), { user: "alice", tabId: 3, url: "https://docs.example.org/", active: true })
      const four = yield* tab(ws, page("four", ["search"], { cache: true }), { user: "alice", tabId: 4, url: "https://docs.example.org/b" })
      const { changes, client } = yield* hub(ws, "alice")
      const tools = yield* toolsUntil(client, (n) => n.length === 3)
      const domainLevel = "website_tool_docs_example_org_search"
      expect(tools.map((t) => t.name).sort()).toEqual([domainLevel, "website_tool_docs_example_org_tab3_search", "website_tool_docs_example_org_tab4_search"])
      expect(tools.find((t) => t.name.endsWith("tab3_search"))?.description).toContain("• active")
      expect(tools.find((t) => t.name.endsWith("tab4_search"))?.description).not.toContain("• active")
      expect(textOf(yield* call(client, domainLevel))).toBe("three:search:")

      const before = changes.length
      four.activate()
      // The descriptions are refreshed and the client told.
      const after = yield* toolsUntil(client, () => true).pipe(
        Effect.filterOrFail((ts) => ts.find((t) => t.name.endsWith("tab4_search"))?.description?.includes("• active") === true),
        Effect.retry({ schedule: Schedule.spaced("10 millis"), times: 300 }),
        Effect.orDie
      )
      expect(after.find((t) => t.name.endsWith("tab3_search"))?.description).not.toContain("• active")
      yield* until(() => changes.length > before, "list_changed after the switch")
      expect(textOf(yield* call(client, domainLevel))).toBe("four:search:")
      expect(three.executed).toHaveLength(1)
      expect(four.executed).toHaveLength(1)
    }))

  it.scopedLive("a tab that closes mid-call is retried on another tab of the domain", () =>
    Effect.gen(function*() {
      const ws = yield* start({ REGISTRY_RETRY_BACKOFF: "100 millis" })
      const never = gate()
      const slow = yield* tab(ws, page("slow", ["checkout"], { gate: never.promise }), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      const fast = yield* tab(ws, page("fast", ["checkout"]), { user: "alice", tabId: 2, url: "https://shop.example.com/" })
      const { client } = yield* hub(ws, "alice")
      yield* toolsUntil(client, (n) => n.length === 2)
      const pending = yield* Effect.fork(call(client, "website_tool_shop_example_com_tab1_checkout", "x"))
      yield* until(() => slow.executed.length === 1, "the call reached tab 1")
      slow.socket.terminate()
      expect(textOf(yield* pending.await.pipe(Effect.flatten))).toBe("fast:checkout:x")
      expect(fast.executed).toHaveLength(1)
    }))

  it.scopedLive("a cached tool with no tab open asks the user's extension for a tab, then runs there", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const first = yield* tab(ws, page("first", ["compose"], { cache: true }), { user: "alice", tabId: 5, url: "https://mail.example.net/inbox" })
      const { client } = yield* hub(ws, "alice")
      yield* toolsUntil(client, (n) => n.length === 2)
      yield* Effect.promise(() => first.close())
      const name = "website_tool_mail_example_net_compose"
      // The tab's own entry goes; the cached, domain-level one stays.
      yield* toolsUntil(client, (n) => n.length === 1 && n[0] === name)

      // No extension connected: the tab cannot be opened.
      const refused = yield* callError(client, name)
      expect(refused?.code).toBe(RegistryProtocol.TabNotFound)
      expect(refused?.message).toContain("No browser extension is connected")

      const ext = yield* extensionOf(ws, "alice")
      const pending = yield* Effect.fork(call(client, name, "hi"))
      const createTab = yield* next(ext.c)
      expect(createTab).toMatchObject({ method: "createTab", params: { url: "https://mail.example.net/inbox" }, id: expect.stringMatching(/^proxy:/) })
      ext.c.send({ jsonrpc: "2.0", id: createTab.id, result: { tabId: 6 } })
      const opened = yield* tab(ws, page("opened", ["compose"], { cache: true }), { user: "alice", tabId: 6, url: "https://mail.example.net/" })
      expect(textOf(yield* pending.await.pipe(Effect.flatten))).toBe("opened:compose:hi")
      expect(opened.executed).toHaveLength(1)
    }))

  it.scopedLive("a cached tool whose new tab never registers fails with TabNotFound after the wait", () =>
    Effect.gen(function*() {
      const ws = yield* start({ REGISTRY_TAB_WAIT: "300 millis" })
      const first = yield* tab(ws, page("first", ["compose"], { cache: true }), { user: "alice", tabId: 5, url: "https://mail.example.net/" })
      const { client } = yield* hub(ws, "alice")
      yield* toolsUntil(client, (n) => n.length === 2)
      yield* Effect.promise(() => first.close())
      yield* toolsUntil(client, (n) => n.length === 1)
      const ext = yield* extensionOf(ws, "alice")
      const pending = yield* Effect.fork(callError(client, "website_tool_mail_example_net_compose"))
      const createTab = yield* next(ext.c)
      ext.c.send({ jsonrpc: "2.0", id: createTab.id, result: {} })
      const error = yield* pending.await.pipe(Effect.flatten)
      expect(error?.code).toBe(RegistryProtocol.TabNotFound)
      expect(error?.message).toMatch(/opened https:\/\/mail\.example\.net\/, but no tab of mail\.example\.net registered compose/)
    }))

  it.scopedLive("another user sees none of it and cannot call it", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const own = yield* tab(ws, page("alice", ["secret"], { cache: true }), { user: "alice", tabId: 1, url: "https://bank.example.com/" })
      const alice = yield* hub(ws, "alice")
      yield* toolsUntil(alice.client, (n) => n.length === 2)
      const bob = yield* hub(ws, "bob")
      expect((yield* Effect.promise(() => bob.client.listTools())).tools).toEqual([])
      for (const name of ["website_tool_bank_example_com_tab1_secret", "website_tool_bank_example_com_secret"]) {
        // Bob's hub has never heard of alice's tools: an unknown name, as for any name it does not list.
        const error = yield* callError(bob.client, name)
        expect(error?.code).toBe(-32602)
      }
      // Bob's own tab with the same id and domain is his alone.
      yield* tab(ws, page("bob", ["secret"]), { user: "bob", tabId: 1, url: "https://bank.example.com/" })
      yield* toolsUntil(bob.client, (n) => n.length === 1)
      expect(textOf(yield* call(bob.client, "website_tool_bank_example_com_tab1_secret"))).toBe("bob:secret:")
      expect(textOf(yield* call(alice.client, "website_tool_bank_example_com_tab1_secret"))).toBe("alice:secret:")
      expect(own.executed).toHaveLength(1)
    }))

  it.scopedLive("progress is relayed from the tab, and a cancel from the client reaches the tab", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      let aborted = false
      let holding = false
      const hold = gate()
      const server = progressPage(async (steps, extra) => {
        extra.signal.addEventListener("abort", () => (aborted = true))
        if (steps > 2) {
          holding = true
          await hold.promise
        }
      })
      yield* tab(ws, server, { user: "alice", tabId: 1, url: "https://work.example.com/" })
      const { client } = yield* hub(ws, "alice")
      yield* toolsUntil(client, (n) => n.length === 1)
      const progress: Array<number> = []
      const done = yield* Effect.promise(() =>
        client.callTool({ name: "website_tool_work_example_com_tab1_long", arguments: { steps: 2 } }, undefined, { onprogress: (p) => void progress.push(p.progress) })
      )
      expect(textOf(done)).toBe("done 2")
      expect(progress).toEqual([1, 2])

      const abort = new AbortController()
      const cancelled = Effect.promise(() =>
        client.callTool({ name: "website_tool_work_example_com_tab1_long", arguments: { steps: 3 } }, undefined, { signal: abort.signal }).then(() => "finished", () => "rejected")
      )
      const fiber = yield* Effect.fork(cancelled)
      yield* until(() => holding, "the call reached the page")
      abort.abort("changed my mind")
      expect(yield* fiber.await.pipe(Effect.flatten)).toBe("rejected")
      yield* until(() => aborted, "the tab's handler saw the cancel")
      hold.open()
    }))

  it.scopedLive("tools/list pages with a cursor; bad cursors, unknown methods and calls before initialize are errors", () =>
    Effect.gen(function*() {
      const ws = yield* start({ REGISTRY_PAGE_SIZE: "2" })
      yield* tab(ws, page("many", ["a", "b", "c", "d", "e"]), { user: "alice", tabId: 1, url: "https://many.example.com/" })
      const { client } = yield* hub(ws, "alice")
      yield* toolsUntil(client, (n) => n.length > 0)
      const names: Array<string> = []
      let cursor: string | undefined
      let pages = 0
      for (;;) {
        const page: { tools: Array<{ name: string }>; nextCursor?: string | undefined } = yield* Effect.promise(() => client.listTools(cursor === undefined ? {} : { cursor }))
        pages++
        names.push(...page.tools.map((t) => t.name))
        if (page.nextCursor === undefined) break
        cursor = page.nextCursor
      }
      if (names.length < 5) return yield* Effect.dieMessage(`only ${names.length} tools listed`)
      expect(pages).toBe(3)
      expect(names).toEqual(["a", "b", "c", "d", "e"].map((t) => `website_tool_many_example_com_tab1_${t}`))

      const raw = yield* connect(`${ws}/hub?token=${yield* token({ sub: "alice" })}`, { protocols: ["mcp"] })
      expect(raw.ws.protocol).toBe("mcp")
      raw.send({ jsonrpc: "2.0", id: 1, method: "tools/list" })
      expect(yield* raw.next).toMatchObject({ id: 1, error: { code: -32600, message: expect.stringContaining("initialize") } })
      raw.send({ jsonrpc: "2.0", id: 2, method: "ping" })
      expect(yield* raw.next).toEqual({ jsonrpc: "2.0", id: 2, result: {} })
      raw.send({ jsonrpc: "2.0", id: 3, method: "initialize", params: { protocolVersion: "2099-01-01", capabilities: {}, clientInfo: { name: "x", version: "0" } } })
      expect(yield* raw.next).toMatchObject({ id: 3, result: { protocolVersion: "2025-11-25", capabilities: { tools: { listChanged: true } }, serverInfo: { name: "switchboard-registry" } } })
      raw.send({ jsonrpc: "2.0", id: 4, method: "tools/list", params: { cursor: "bogus" } })
      expect(yield* raw.next).toMatchObject({ id: 4, error: { code: -32602 } })
      raw.send({ jsonrpc: "2.0", id: 5, method: "resources/list" })
      expect(yield* raw.next).toMatchObject({ id: 5, error: { code: -32601 } })
      raw.send({ jsonrpc: "2.0", id: 6, method: "tools/call", params: { name: 7 } })
      expect(yield* raw.next).toMatchObject({ id: 6, error: { code: -32602 } })
      raw.send({ jsonrpc: "2.0", id: 7, method: "tools/call", params: { name: "website_tool_nowhere" } })
      // A name the hub never listed is a bad parameter (MCP's -32602); TabNotFound is for a known tool no tab can serve.
      expect(yield* raw.next).toMatchObject({ id: 7, error: { code: -32602, message: "Unknown tool: website_tool_nowhere; tools/list shows what the open tabs offer" } })
    }))
})

describe("/hub as an MCP WebSocket session", () => {
  it.scopedLive("authenticates by header, query or first message; refuses a missing or bad token", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const good = yield* token({ sub: "alice" })
      yield* tab(ws, page("p", ["t"]), { user: "alice", tabId: 1, url: "https://p.example.com/" })

      const byHeader = yield* connect(`${ws}/hub`, { protocols: ["mcp"], headers: { authorization: `Bearer ${good}` } })
      byHeader.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18" } })
      expect(yield* byHeader.next).toMatchObject({ id: 1, result: { protocolVersion: "2025-06-18" } })

      const firstMessage = yield* connect(`${ws}/hub`, { protocols: ["mcp"] })
      firstMessage.send({ jsonrpc: "2.0", method: "authenticate", params: { token: good } })
      firstMessage.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18" } })
      expect(yield* firstMessage.next).toMatchObject({ id: 1, result: { protocolVersion: "2025-06-18" } })
      firstMessage.send({ jsonrpc: "2.0", id: 2, method: "tools/list" })
      expect(yield* firstMessage.next).toMatchObject({ id: 2, result: { tools: [{ name: "website_tool_p_example_com_tab1_t" }] } })

      const asRequest = yield* connect(`${ws}/hub`, { protocols: ["mcp"] })
      asRequest.send({ jsonrpc: "2.0", id: "a", method: "authenticate", params: { token: good } })
      expect(yield* asRequest.next).toEqual({ jsonrpc: "2.0", id: "a", result: {} })

      const none = yield* connect(`${ws}/hub`, { protocols: ["mcp"] })
      none.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: {} })
      expect(yield* closedWith(none)).toMatchObject({ code: 1008, reason: expect.stringContaining("Authentication required") })

      const bad = yield* connect(`${ws}/hub`, { protocols: ["mcp"] })
      bad.send({ jsonrpc: "2.0", method: "authenticate", params: { token: "not-a-jwt" } })
      expect(yield* closedWith(bad)).toMatchObject({ code: 1008, reason: expect.stringContaining("Authentication failed") })

      const old = expiredToken("alice")
      const late = yield* connect(`${ws}/hub`, { protocols: ["mcp"] })
      late.send({ jsonrpc: "2.0", method: "authenticate", params: { token: old } })
      expect(yield* closedWith(late)).toEqual({ code: 1008, reason: "Authentication failed: token expired" })
      const refused = yield* connect(`${ws}/hub?token=not-a-jwt`, { protocols: ["mcp"] }).pipe(Effect.flip)
      expect(refused).toMatchObject({ status: 401 })
    }))

  it.scopedLive("the auth deadline closes a silent socket with 1008", () =>
    Effect.gen(function*() {
      const ws = yield* start({ REGISTRY_AUTH_TIMEOUT: "200 millis" })
      const silent = yield* connect(`${ws}/hub`, { protocols: ["mcp"] })
      expect((yield* closedWith(silent)).code).toBe(1008)
      const quietTab = yield* connect(`${ws}/tabs?token=${yield* token({ sub: "alice" })}`)
      expect(yield* closedWith(quietTab)).toMatchObject({ code: 1008, reason: expect.stringContaining("browser/hello") })
    }))

  it.scopedLive("binary frames close with 1003 and invalid frames with 1002; other sessions carry on", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const other = yield* rawHub(ws, "alice")
      const binary = yield* rawHub(ws, "alice")
      binary.ws.send(Buffer.from([1, 2, 3]))
      expect((yield* closedWith(binary)).code).toBe(1003)
      const garbage = yield* rawHub(ws, "alice")
      garbage.send("{not json")
      expect(yield* garbage.next).toMatchObject({ id: null, error: { code: -32700 } })
      expect((yield* closedWith(garbage)).code).toBe(1002)
      const wrongShape = yield* rawHub(ws, "alice")
      wrongShape.send({ jsonrpc: "2.0", id: {}, method: 5 })
      expect(yield* wrongShape.next).toMatchObject({ error: { code: -32600 } })
      expect((yield* closedWith(wrongShape)).code).toBe(1002)
      other.send({ jsonrpc: "2.0", id: 9, method: "ping" })
      expect(yield* other.next).toEqual({ jsonrpc: "2.0", id: 9, result: {} })
    }))

  it.scopedLive("a page Origin that is not allowed is refused at the upgrade", () =>
    Effect.gen(function*() {
      const ws = yield* start({ ALLOWED_ORIGINS: "https://app.example.com" })
      const t = yield* token({ sub: "alice" })
      const refused = yield* connect(`${ws}/hub?token=${t}`, { protocols: ["mcp"], origin: "https://evil.example.com" }).pipe(Effect.flip)
      expect(refused).toMatchObject({ status: 403 })
      const allowed = yield* connect(`${ws}/hub?token=${t}`, { protocols: ["mcp"], origin: "https://app.example.com" })
      expect(allowed.ws.protocol).toBe("mcp")
    }))
})

describe("/tabs: what a tab may send", () => {
  const rawTab = (ws: string, user = "alice", origin?: string) =>
    Effect.flatMap(token({ sub: user }), (t) => connect(`${ws}/tabs?token=${t}`, origin === undefined ? {} : { origin }))
  const hello = (tabId: number, url: string) => ({ jsonrpc: "2.0", method: "browser/hello", params: { tabId, url } })
  const register = (tools: Array<unknown>) => ({ jsonrpc: "2.0", method: "browser/registerTools", params: { tools } })
  const tool = (name: string, extra: object = {}) => ({ name, inputSchema: { type: "object" }, ...extra })

  it.scopedLive("invalid tools are rejected and the rest register; the same list again changes nothing", () =>
    Effect.gen(function*() {
      const ctx = yield* build()
      const ws = wsOf(ctx)
      const tabs = yield* Context.get(ctx, Kv.Kv).bucket(Subjects.Bucket.tabs)
      const revision = Effect.map(tabs.get(Subjects.Key.tab("alice", "x.example.com", 1)), (e) => Option.getOrThrow(e).revision)
      const t = yield* rawTab(ws)
      t.send(hello(1, "https://x.example.com/"))
      t.send({
        jsonrpc: "2.0",
        id: "r1",
        method: "browser/registerTools",
        params: {
          tools: [
            tool("ok"),
            { inputSchema: { type: "object" } },
            { name: "noSchema" },
            tool("arraySchema", { inputSchema: { type: "array" } }),
            tool("badDescription", { description: 5 }),
            "not a tool",
            tool("ok", { description: "again" }),
            tool("x".repeat(129)),
            tool("also-ok", { description: "fine" })
          ]
        }
      })
      const answer = (yield* t.next) as { result: { registered: number; rejected: Array<string> } }
      expect(answer.result.registered).toBe(2)
      expect(answer.result.rejected).toHaveLength(7)
      const { changes, client } = yield* hub(ws, "alice")
      yield* toolsUntil(client, (n) => n.length === 2)
      expect((yield* Effect.promise(() => client.listTools())).tools.map((x) => x.name)).toEqual([
        "website_tool_x_example_com_tab1_also_ok",
        "website_tool_x_example_com_tab1_ok"
      ])
      const before = changes.length
      const written = yield* revision
      t.send(register([tool("also-ok", { description: "fine" }), tool("ok")]))
      t.send({ jsonrpc: "2.0", id: "sync", method: "browser/updateTools", params: { tools: [tool("also-ok", { description: "fine" }), tool("ok")] } })
      // Answered after the tab's record would have been written: it was not, so nobody is told.
      expect(yield* t.next).toMatchObject({ id: "sync", result: { registered: 2 } })
      expect(yield* revision).toBe(written)
      expect(changes.length).toBe(before)
    }))

  it.scopedLive("an empty list unregisters the tab's tools but keeps its cached ones", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const t = yield* rawTab(ws)
      t.send(hello(2, "https://y.example.com/"))
      t.send(register([tool("plain"), tool("kept", { annotations: { cache: true } })]))
      const { client } = yield* hub(ws, "alice")
      yield* toolsUntil(client, (n) => n.length === 3)
      t.send(register([]))
      const left = yield* toolsUntil(client, (n) => n.length === 1)
      expect(left.map((x) => x.name)).toEqual(["website_tool_y_example_com_kept"])
    }))

  it.scopedLive("a reconnect with the same tab id replaces the old socket", () =>
    Effect.gen(function*() {
      const ctx = yield* build()
      const ws = wsOf(ctx)
      const kv = Context.get(ctx, Kv.Kv)
      const tabs = Kv.typed(yield* kv.bucket(Subjects.Bucket.tabs), RegistryProtocol.TabRecord)
      const connections = yield* kv.bucket(Subjects.Bucket.connections)
      const old = yield* rawTab(ws)
      old.send(hello(3, "https://z.example.com/"))
      old.send(register([tool("a")]))
      const { client } = yield* hub(ws, "alice")
      yield* toolsUntil(client, (n) => n.length === 1)
      const key = Subjects.Key.tab("alice", "z.example.com", 3)
      const oldConn = Option.getOrThrow(yield* tabs.get(key)).value.conn
      const fresh = yield* rawTab(ws)
      fresh.send(hello(3, "https://z.example.com/reloaded"))
      expect(yield* closedWith(old)).toMatchObject({ code: 1000, reason: expect.stringContaining("replaced") })
      fresh.send(register([tool("b")]))
      yield* toolsUntil(client, (n) => n.length === 1 && n[0] === "website_tool_z_example_com_tab3_b")
      // The old socket's goodbye (its actor ends, and its connection record goes) does not remove the new entry.
      yield* connections.get(oldConn).pipe(
        Effect.filterOrFail(Option.isNone, () => "the old socket's actor is still there"),
        Effect.retry({ schedule: Schedule.spaced("10 millis"), times: 500 }),
        Effect.orDie
      )
      expect((yield* Effect.promise(() => client.listTools())).tools.map((x) => x.name)).toEqual(["website_tool_z_example_com_tab3_b"])
    }))

  it.scopedLive("bad input: invalid JSON, requests before hello, bad hello, unknown methods, origin mismatch, spoofed answers", () =>
    Effect.gen(function*() {
      // The edge lets evil.example.com's pages through, so that the registry's own check (the
      // Origin must be the tab's) is what refuses one claiming another site's tab.
      const ws = yield* start({ ALLOWED_ORIGINS: "https://evil.example.com" })
      const t = yield* rawTab(ws)
      t.send("{oops")
      expect(yield* t.next).toMatchObject({ id: null, error: { code: -32700 } })
      t.send({ jsonrpc: "2.0", id: 1, method: "browser/registerTools", params: { tools: [] } })
      expect(yield* t.next).toMatchObject({ id: 1, error: { code: -32600, message: expect.stringContaining("browser/hello") } })
      t.send({ jsonrpc: "2.0", id: 2, method: "browser/hello", params: { tabId: 1, url: "https://ok.example.com/" } })
      expect(yield* t.next).toEqual({ jsonrpc: "2.0", id: 2, result: { domain: "ok.example.com", tabId: 1 } })
      t.send({ jsonrpc: "2.0", id: 3, method: "browser/registerTools", params: { tools: "nope" } })
      expect(yield* t.next).toMatchObject({ id: 3, error: { code: -32602 } })
      t.send({ jsonrpc: "2.0", id: 4, method: "tools/call", params: {} })
      expect(yield* t.next).toMatchObject({ id: 4, error: { code: -32601 } })
      t.send({ jsonrpc: "2.0", id: 5, method: "browser/hello", params: { tabId: 2, url: "https://ok.example.com/" } })
      expect(yield* t.next).toMatchObject({ id: 5, error: { code: -32600, message: expect.stringContaining("identity") } })
      // A made-up answer to a call that was never sent goes nowhere (and the socket stays).
      t.send({ jsonrpc: "2.0", id: "00000000-0000-4000-8000-000000000000:1", result: { success: true, payload: {} } })
      t.send({ jsonrpc: "2.0", id: "sb.>:1", result: { success: true, payload: {} } })
      t.send({ jsonrpc: "2.0", id: 6, method: "browser/activated" })
      expect(yield* t.next).toEqual({ jsonrpc: "2.0", id: 6, result: {} })

      const badHello = yield* rawTab(ws)
      badHello.send({ jsonrpc: "2.0", method: "browser/hello", params: { tabId: -1, url: "https://a.example.com/" } })
      expect((yield* closedWith(badHello)).code).toBe(1002)
      const notHttp = yield* rawTab(ws)
      notHttp.send(hello(1, "file:///etc/passwd"))
      expect((yield* closedWith(notHttp)).code).toBe(1002)
      const elsewhere = yield* rawTab(ws, "alice", "https://evil.example.com")
      elsewhere.send(hello(1, "https://bank.example.com/"))
      expect(yield* closedWith(elsewhere)).toMatchObject({ code: 1008, reason: expect.stringContaining("Origin") })
      // A token on the upgrade is still checked (old clients): a bad one never gets a socket.
      const badToken = yield* connect(`${ws}/tabs?token=not-a-jwt`).pipe(Effect.flip)
      expect(badToken).toMatchObject({ status: 401 })
    }))

  it.scopedLive("an answer from a tab other than the one called is dropped", () =>
    Effect.gen(function*() {
      const ws = yield* start({ REGISTRY_CALL_TIMEOUT: "500 millis" })
      const target = yield* rawTab(ws)
      target.send(hello(1, "https://t.example.com/"))
      target.send(register([tool("run")]))
      const spoofer = yield* rawTab(ws)
      spoofer.send(hello(2, "https://s.example.com/"))
      const { client } = yield* hub(ws, "alice")
      yield* toolsUntil(client, (n) => n.length === 1)
      const pending = yield* Effect.fork(callError(client, "website_tool_t_example_com_tab1_run"))
      const execute = (yield* target.next) as { id: string; method: string; params: unknown }
      expect(execute).toMatchObject({ method: "browser/executeTool", params: { toolName: "run", args: {} } })
      spoofer.send({ jsonrpc: "2.0", id: execute.id, result: { success: true, payload: { content: [{ type: "text", text: "spoofed" }] } } })
      // The real tab never answers: the call times out rather than take the spoofed answer.
      const error = yield* pending.await.pipe(Effect.flatten)
      expect(error?.message).toContain("timed out")
      expect(yield* target.next).toMatchObject({ method: "notifications/cancelled", params: { requestId: execute.id } })
    }))

  it.scopedLive("the tab's failures reach the client as tool errors; malformed answers and the tab's cancels as errors", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const t = yield* rawTab(ws)
      t.send(hello(1, "https://f.example.com/"))
      t.send(register([tool("run")]))
      const { client } = yield* hub(ws, "alice")
      yield* toolsUntil(client, (n) => n.length === 1)
      const answers = [
        { result: { success: false, payload: "the page said no" } },
        { result: { success: true, payload: "plain text" } },
        { result: { nothing: true } },
        { error: { code: -32602, message: "bad args" } }
      ]
      const outcomes: Array<unknown> = []
      for (const answer of answers) {
        const pending = yield* Effect.fork(Effect.promise(() => client.callTool({ name: "website_tool_f_example_com_tab1_run", arguments: {} }).then((r) => r, (e: unknown) => e)))
        const execute = (yield* t.next) as { id: string }
        t.send({ jsonrpc: "2.0", id: execute.id, ...answer })
        outcomes.push(yield* pending.await.pipe(Effect.flatten))
      }
      expect(outcomes[0]).toEqual({ content: [{ type: "text", text: "the page said no" }], isError: true })
      expect(outcomes[1]).toEqual({ content: [{ type: "text", text: "plain text" }] })
      expect(outcomes[2]).toMatchObject({ code: -32603 })
      expect(outcomes[3]).toMatchObject({ code: -32602, message: expect.stringContaining("bad args") })

      // A tab that gives up on a call says so with notifications/cancelled; the client gets an error.
      const pending = yield* Effect.fork(callError(client, "website_tool_f_example_com_tab1_run"))
      const execute = (yield* t.next) as { id: string }
      t.send({ jsonrpc: "2.0", method: "notifications/cancelled", params: { requestId: execute.id, reason: "the page navigated away" } })
      expect(yield* pending.await.pipe(Effect.flatten)).toMatchObject({ code: -32603, message: expect.stringContaining("the page navigated away") })
    }))

  it.scopedLive("stale tab entries whose socket is gone are pruned", () =>
    Effect.gen(function*() {
      // Fresh when written, so the hub sees it before a sweep (every 1.5 s here) finds it stale.
      const ctx = yield* build({ REGISTRY_STALE_TAB_AGE: "1500 millis" })
      const bucket = yield* Context.get(ctx, Kv.Kv).bucket(Subjects.Bucket.tabs)
      const stale: RegistryProtocol.TabRecord = {
        user: "alice",
        domain: "old.example.com",
        tabId: 9,
        url: "https://old.example.com/",
        conn: "00000000-0000-4000-8000-000000000009",
        edge: "edge-gone",
        activatedAt: 0,
        updatedAt: Date.now(),
        tools: [{ name: "gone", inputSchema: { type: "object" } }]
      }
      yield* bucket.put(Subjects.Key.tab("alice", stale.domain, stale.tabId), JSON.stringify(stale))
      const { client } = yield* hub(wsOf(ctx), "alice")
      yield* toolsUntil(client, (n) => n.length === 1)
      yield* toolsUntil(client, (n) => n.length === 0)
    }))
})

describe("/tabs: a tab bridge authenticates in-band", () => {
  const authenticate = (t: string, id?: string) => ({ jsonrpc: "2.0", ...(id === undefined ? {} : { id }), method: "authenticate", params: { token: t } })
  const hello = (tabId: number, url: string, id?: string) => ({ jsonrpc: "2.0", ...(id === undefined ? {} : { id }), method: "browser/hello", params: { tabId, url } })
  const register = (names: ReadonlyArray<string>, id?: string) => ({
    jsonrpc: "2.0",
    ...(id === undefined ? {} : { id }),
    method: "browser/registerTools",
    params: { tools: names.map((name) => ({ name, inputSchema: { type: "object" } })) }
  })
  const tabRecord = (ctx: Context.Context<Kv.Kv>, user: string, domain: string, tabId: number) =>
    Effect.flatMap(Context.get(ctx, Kv.Kv).bucket(Subjects.Bucket.tabs), (tabs) => tabs.get(Subjects.Key.tab(user, domain, tabId)))

  it.scopedLive("a socket with no token in its URL that sends authenticate first registers tools the same user's /hub sees and calls", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const bridge = yield* tab(ws, page("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/", auth: "in-band" })
      const { client } = yield* hub(ws, "alice")
      yield* toolsUntil(client, (n) => n.includes("website_tool_shop_example_com_tab1_getCart"))
      expect(textOf(yield* call(client, "website_tool_shop_example_com_tab1_getCart", "in-band"))).toBe("shop:getCart:in-band")
      expect(bridge.executed).toHaveLength(1)

      // As a request, authenticate is answered, as on /hub; then the tab goes on as any other.
      const raw = yield* connect(`${ws}/tabs`)
      raw.send(authenticate(yield* token({ sub: "alice" }), "auth"))
      expect(yield* raw.next).toEqual({ jsonrpc: "2.0", id: "auth", result: {} })
      raw.send(hello(2, "https://shop.example.com/", "h"))
      expect(yield* raw.next).toEqual({ jsonrpc: "2.0", id: "h", result: { domain: "shop.example.com", tabId: 2 } })
      raw.send(register(["search"], "r"))
      expect(yield* raw.next).toMatchObject({ id: "r", result: { registered: 1 } })
      yield* toolsUntil(client, (n) => n.includes("website_tool_shop_example_com_tab2_search"))
    }))

  it.scopedLive("another user's token registers the tab under that user only", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      yield* tab(ws, page("bob", ["secret"]), { user: "bob", tabId: 1, url: "https://bank.example.com/", auth: "in-band" })
      const bob = yield* hub(ws, "bob")
      yield* toolsUntil(bob.client, (n) => n.length === 1)
      expect(textOf(yield* call(bob.client, "website_tool_bank_example_com_tab1_secret"))).toBe("bob:secret:")
      const alice = yield* hub(ws, "alice")
      expect((yield* Effect.promise(() => alice.client.listTools())).tools).toEqual([])
      expect((yield* callError(alice.client, "website_tool_bank_example_com_tab1_secret"))?.code).toBe(-32602)
    }))

  it.scopedLive("frames before authenticate are refused with 1008 and nothing they asked for is done", () =>
    Effect.gen(function*() {
      const ctx = yield* build()
      const ws = wsOf(ctx)
      const early = yield* connect(`${ws}/tabs`)
      early.send(hello(1, "https://early.example.com/", "h"))
      early.send(register(["grab"], "r"))
      early.send(authenticate(yield* token({ sub: "alice" })))
      expect(yield* closedWith(early)).toEqual({ code: 1008, reason: "Authentication required: send authenticate first, or connect with ?token=" })
      // Not answered, not stored: the hello and the tools went nowhere.
      expect(yield* Queue.size(early.messages)).toBe(0)
      expect(Option.isNone(yield* tabRecord(ctx, "alice", "early.example.com", 1))).toBe(true)
      const { client } = yield* hub(ws, "alice")
      expect((yield* Effect.promise(() => client.listTools())).tools).toEqual([])

      // A spoofed answer to some hub's call is no better.
      const spoof = yield* connect(`${ws}/tabs`)
      spoof.send({ jsonrpc: "2.0", id: "00000000-0000-4000-8000-000000000000:1", result: { success: true, payload: {} } })
      expect(yield* closedWith(spoof)).toMatchObject({ code: 1008, reason: expect.stringContaining("Authentication required") })
    }))

  it.scopedLive("a bad token, or none, in authenticate closes with 1008 and says why", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const bad = yield* connect(`${ws}/tabs`)
      bad.send(authenticate("not-a-jwt", "a"))
      expect(yield* closedWith(bad)).toMatchObject({ code: 1008, reason: expect.stringMatching(/^Authentication failed: ./) })
      expect(yield* Queue.size(bad.messages)).toBe(0)

      const empty = yield* connect(`${ws}/tabs`)
      empty.send({ jsonrpc: "2.0", method: "authenticate", params: {} })
      expect(yield* closedWith(empty)).toEqual({ code: 1008, reason: "Authentication failed: authenticate needs params.token" })

      // Once authenticated, a socket cannot become another user's.
      const switching = yield* connect(`${ws}/tabs`)
      switching.send(authenticate(yield* token({ sub: "alice" }), "1"))
      expect(yield* switching.next).toEqual({ jsonrpc: "2.0", id: "1", result: {} })
      switching.send(authenticate(yield* token({ sub: "bob" }), "2"))
      expect(yield* closedWith(switching)).toEqual({ code: 1008, reason: "Authentication failed: a session cannot change its user" })
    }))

  it.scopedLive("a socket that never authenticates is closed with 1008 after REGISTRY_AUTH_TIMEOUT, and so is one that authenticated but never said hello", () =>
    Effect.gen(function*() {
      const ws = yield* start({ REGISTRY_AUTH_TIMEOUT: "300 millis" })
      const silent = yield* connect(`${ws}/tabs`)
      expect(yield* closedWith(silent)).toEqual({ code: 1008, reason: "Authentication failed: no authenticate message in time" })
      const noHello = yield* connect(`${ws}/tabs`)
      noHello.send(authenticate(yield* token({ sub: "alice" }), "a"))
      expect(yield* noHello.next).toEqual({ jsonrpc: "2.0", id: "a", result: {} })
      expect(yield* closedWith(noHello)).toMatchObject({ code: 1008, reason: expect.stringContaining("browser/hello") })
    }))
})
