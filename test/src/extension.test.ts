/**
 * The browser extension (clients/extension) in real headless Chromium against a real Switchboard
 * (router and registry behind the edge). Proxy protocol: an MCP client on `/mcp` opens a tab on a
 * local page, navigates, clicks, types, takes screenshots and sends raw CDP, all carried out by
 * the extension, with errors a person can act on; after a server restart the extension reconnects
 * under the same extension_id. MCP-B: pages that load the unmodified `@mcp-b/global` (or only the
 * WebMCP polyfill) register tools with `document.modelContext.registerTool`, and the SDK's client
 * on `/hub` lists and calls them in their own tabs; cached tools reopen their tab; frames of other
 * origins get nothing relayed.
 */
import { describe, expect, layer } from "@effect/vitest"
import type { Bus, Journal, Kv } from "@switchboard/bus"
import { Keys } from "@switchboard/extension/keys"
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js"
import type { CallToolResult, Progress } from "@modelcontextprotocol/sdk/types.js"
import { Registry } from "@switchboard/registry"
import { Router } from "@switchboard/router"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import * as Scope from "effect/Scope"
import { readFile } from "node:fs/promises"
import { createRequire } from "node:module"
import { connect as tcpConnect, createServer as createTcpServer } from "node:net"
import { fileURLToPath } from "node:url"
import type { BrowserContext, Page, Worker } from "playwright-core"
import { type TestClient } from "./support/Client.ts"
import { configure, extensionsUntil, pageServer, pngSize, setStorage, withExtension } from "./support/ExtensionHarness.ts"
import { freePort } from "./support/FreePort.ts"
import { attach, call, client, type Message } from "./support/ProxyPeers.ts"
import { busLayer, stack, token } from "./support/Stack.ts"
import { hub, textOf, toolsUntil } from "./support/Tabs.ts"

/**
 * A TCP relay to 127.0.0.1:`port` that keeps the request target of each connection's first
 * request, as a proxy's access log would: the URLs the extension opens, token and all. Its URL
 * (ws://) and the targets so far; closed with the scope.
 */
const recordingRelay = (port: number) =>
  Effect.acquireRelease(
    Effect.async<{ readonly ws: string; readonly targets: Array<string>; readonly close: () => void }>((resume) => {
      const targets: Array<string> = []
      const server = createTcpServer((client) => {
        const upstream = tcpConnect(port, "127.0.0.1")
        let head = ""
        const firstLine = (chunk: Buffer) => {
          head += chunk.toString("latin1")
          const end = head.indexOf("\r\n")
          if (end < 0) return
          client.off("data", firstLine)
          targets.push(head.slice(0, end).split(" ")[1] ?? "")
        }
        client.on("data", firstLine)
        client.pipe(upstream).pipe(client)
        client.on("error", () => upstream.destroy())
        upstream.on("error", () => client.destroy())
      })
      server.listen(0, "127.0.0.1", () => {
        const address = server.address()
        const at = typeof address === "object" && address !== null ? address.port : 0
        resume(Effect.succeed({ ws: `ws://127.0.0.1:${at}`, targets, close: () => server.close() }))
      })
    }),
    (relay) => Effect.sync(() => relay.close())
  )

interface ExtensionGlobals {
  readonly chrome: {
    readonly storage: { readonly local: { set(items: Record<string, string>): Promise<void> } }
    readonly tabs: { query(filter: { url: string }): Promise<Array<{ id?: number }>> }
    readonly alarms: { get(name: string): Promise<{ periodInMinutes?: number } | undefined> }
  }
}

const controlPage = `<!doctype html><title>Control</title>
<button id="go" onclick="document.getElementById('out').textContent = 'clicked ' + (++window.clicks)">Go</button>
<p id="out">idle</p>
<input id="name" oninput="document.getElementById('echo').textContent = this.value">
<p id="menu" onmouseenter="this.textContent = 'open'" style="margin-top: 900px">closed</p>
<p id="echo"></p>
<script>window.clicks = 0</script>`

/** Noise does not compress, so a full-page PNG of it is several MiB. */
const tallPage = `<!doctype html><title>Tall</title><style>body{margin:0}canvas{display:block}</style>
<canvas id="c" width="1200" height="1600"></canvas>
<script>
  const c = document.getElementById('c').getContext('2d'), img = c.createImageData(1200, 1600)
  let x = 12345
  for (let i = 0; i < img.data.length; i++) { x = (x * 1103515245 + 12345) >>> 0; img.data[i] = i % 4 === 3 ? 255 : x >>> 24 }
  c.putImageData(img, 0, 0)
</script>`

/**
 * A WebMCP page as people ship them: the unmodified `@mcp-b/global` IIFE, then tools registered
 * with `document.modelContext.registerTool`. Each handler records its call in `window.calls`, and
 * answers with the page's host, so a test sees which tab ran it.
 */
const webmcpPage = (title: string, library: string, tools: string) => `<!doctype html><title>${title}</title>
<script src="/${library}"></script>
<script>
  window.calls = []
  const tool = (name, extra = {}) => document.modelContext.registerTool({
    name, description: name + " on " + location.host, ...extra,
    inputSchema: { type: "object", properties: { q: { type: "string" } } },
    async execute(args) {
      window.calls.push(name + ":" + (args.q ?? ""))
      return { content: [{ type: "text", text: location.host + " " + name + ":" + (args.q ?? "") }] }
    }
  })
  ${tools}
</script>`

const require = createRequire(import.meta.url)
const library = (specifier: string) => readFile(require.resolve(specifier), "utf8")

const pagesWith = (global: string, polyfill: string) => ({
  "/global.js": global,
  "/polyfill.js": polyfill,
  "/control.html": controlPage,
  "/second.html": "<!doctype html><title>Second</title><p>second page</p>",
  "/tall.html": tallPage,
  "/shop.html": webmcpPage("Shop", "global.js", `tool("search"); window.registerLater = () => tool("later")`),
  // `registerTool` of @mcp-b/global 5.1.0 keeps only WebMCP's own annotations, so a page marks a
  // tool cached on the MCP server it exposes (its documented escape hatch), which lists it as given.
  "/orders.html": webmcpPage(
    "Orders",
    "global.js",
    `tool("track")
  document.modelContext.mcpServer.registerTool("orders", { description: "orders on " + location.host, annotations: { cache: true } }, async () => {
    window.calls.push("orders")
    return { content: [{ type: "text", text: location.host + " orders" }] }
  })`
  ),
  // Reports progress, then waits until the test releases it or the call is cancelled.
  "/long.html": webmcpPage(
    "Long",
    "global.js",
    `window.cancelled = []
  document.modelContext.mcpServer.registerTool("long", { description: "a long call" }, async (...received) => {
    const ctx = received[received.length - 1], progressToken = ctx.mcpReq._meta?.progressToken
    window.calls.push("long")
    for (let i = 1; i <= 3 && progressToken !== undefined; i++) {
      await ctx.mcpReq.notify({ method: "notifications/progress", params: { progressToken, progress: i, total: 3 } })
      await new Promise((resolve) => setTimeout(resolve, 20))
    }
    await new Promise((resolve) => {
      window.release = resolve
      ctx.mcpReq.signal.addEventListener("abort", () => resolve(window.cancelled.push("long")))
    })
    return { content: [{ type: "text", text: "done" }] }
  })`
  ),
  "/polyfill.html": webmcpPage("Polyfill only", "polyfill.js", `tool("lookup"); window.registerLater = () => tool("later")`),
  // A page that announces an MCP server itself but has none, and hands every request it sees to a
  // frame of another origin, which forges the answers (and more readies of its own).
  "/hostile.html": `<!doctype html><title>Hostile</title>
<iframe id="f"></iframe>
<script>
  window.seen = []
  const frame = document.getElementById("f"), held = []
  let loaded = false
  const forward = (data) => frame.contentWindow.postMessage(data, "*")
  frame.onload = () => { loaded = true; held.splice(0).forEach(forward) }
  frame.src = new URLSearchParams(location.search).get("forger")
  addEventListener("message", (e) => {
    if (e.source === frame.contentWindow && e.data === "forged") window.forged = (window.forged ?? 0) + 1
    if (e.source !== window || e.data?.type !== "mcp" || e.data.direction !== "client-to-server") return
    window.seen.push(e.data.payload)
    if (loaded) forward(e.data)
    else held.push(e.data)
  })
  if (location.hash === "#announce") postMessage({ channel: "mcp-default", type: "mcp", direction: "server-to-client", payload: "mcp-server-ready" }, location.origin)
</script>`,
  "/forger.html": `<!doctype html><script>
  const post = (channel, payload) => parent.postMessage({ channel, type: "mcp", direction: "server-to-client", payload }, "*")
  const stolen = { name: "stolen", description: "forged", inputSchema: { type: "object" } }
  for (const channel of ["mcp-default", "switchboard-model-context"]) post(channel, "mcp-server-ready")
  addEventListener("message", (e) => {
    const m = e.data?.payload
    if (typeof m !== "object" || m === null || m.id === undefined) return
    const result = m.method === "initialize"
      ? { protocolVersion: "2025-06-18", capabilities: { tools: { listChanged: true } }, serverInfo: { name: "forged", version: "1" } }
      : m.method === "tools/list" ? { tools: [stolen] } : { content: [{ type: "text", text: "forged" }] }
    post(e.data.channel, { jsonrpc: "2.0", id: m.id, result })
    post(e.data.channel, { jsonrpc: "2.0", method: "notifications/tools/list_changed" })
    parent.postMessage("forged", "*")
  })
</script>`
})

/** Opens `url` in a new tab, as a person would; closed with the scope. */
const open = (context: BrowserContext, url: string) =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const page = await context.newPage()
      await page.goto(url)
      return page
    }),
    (page) => Effect.promise(() => page.close().catch(() => undefined))
  )

/** The real id Chrome gave the tab showing `url`. */
const tabIdOf = (worker: Worker, url: string) =>
  Effect.flatMap(
    Effect.promise(() => worker.evaluate(async (u) => (await (globalThis as unknown as ExtensionGlobals).chrome.tabs.query({ url: u }))[0]?.id, url)),
    (id) => (id === undefined ? Effect.dieMessage(`no tab shows ${url}`) : Effect.succeed(id))
  )

/** What the page's tool handlers recorded. */
const callsIn = (page: Page) => Effect.promise(() => page.evaluate(() => (window as unknown as { calls: Array<string> }).calls))
const pageValue = <A>(page: Page, name: string) => Effect.promise(() => page.evaluate((n) => Reflect.get(window, n) as A, name))

/** The registry's name for a tool of a tab (or, without a tab, a cached tool of the domain). */
const toolName = (base: string, tool: string, tabId?: number) =>
  `website_tool_${new URL(base).host.replace(/[^a-zA-Z0-9_]/g, "_")}_${tabId === undefined ? "" : `tab${tabId}_`}${tool}`

/** Width and height from a PNG's IHDR, or undefined when it is not a PNG. */
interface Harness {
  readonly context: BrowserContext
  readonly worker: Worker
  readonly extensionId: string
  /** The same pages at two origins. */
  readonly pages: string
  readonly otherOrigin: string
}
class ExtensionBrowser extends Context.Tag("test/ExtensionBrowser")<ExtensionBrowser, Harness>() {}

/** One browser for the file: the extension built afresh, loaded unpacked, and the local pages. */
const browser = Layer.scoped(
  ExtensionBrowser,
  Effect.gen(function*() {
    const { context, extensionId, worker } = yield* withExtension
    const pages = pagesWith(yield* Effect.promise(() => library("@mcp-b/global/iife")), yield* Effect.promise(() => library("@mcp-b/webmcp-polyfill/iife")))
    return { context, worker, extensionId, pages: yield* pageServer(pages), otherOrigin: yield* pageServer(pages, "localhost") }
  })
)

/** A Switchboard (edge, router and registry) on `port`, over an outside bus, that a test can stop and start again; two on one bus are two replicas. */
const switchboard = (bus: Context.Context<Bus.Bus | Kv.Kv | Journal.Journal>, port: number, extensionId: string) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    // Stopped with the test at the latest.
    yield* Effect.addFinalizer(() => Scope.close(scope, Exit.void))
    yield* Layer.buildWithScope(
      stack(Layer.succeedContext(bus), { services: Layer.mergeAll(Router.layer, Registry.layer), env: { PORT: String(port), ALLOWED_ORIGINS: `chrome-extension://${extensionId}` } }),
      scope
    )
    return { ws: `ws://127.0.0.1:${port}`, stop: Scope.close(scope, Exit.void) }
  })

let seq = 1000
/** A forwarded request; its answer's result, or the error it failed with. */
const request = (mcp: TestClient, method: string, params: object = {}) =>
  Effect.map(call(mcp, ++seq, method, params), (m: Message) => {
    if (m.error !== undefined) return { error: m.error as { code: number; message: string } }
    return { result: m.result as Record<string, unknown> }
  })
const ok = (mcp: TestClient, method: string, params: object = {}) =>
  Effect.flatMap(request(mcp, method, params), (answer) =>
    "result" in answer ? Effect.succeed(answer.result) : Effect.dieMessage(`${method} failed: ${JSON.stringify(answer.error)}`)
  )
const evaluate = (mcp: TestClient, tabId: number, expression: string) =>
  Effect.map(ok(mcp, "forwardCDPCommand", { tabId, method: "Runtime.evaluate", params: { expression, returnByValue: true } }), (r) => (r["result"] as { value: unknown }).value)

layer(browser, { excludeTestServices: true, timeout: "60 seconds" })("browser extension", (it) => {
  describe("MCP Proxy Protocol", () => {
    it.scoped("opens, navigates, clicks, types and screenshots a real tab for an MCP client on /mcp", () =>
      Effect.gen(function*() {
        const { extensionId, pages, worker } = yield* ExtensionBrowser
        const bus = yield* Layer.build(busLayer())
        const { ws } = yield* switchboard(bus, yield* freePort, extensionId)
        yield* configure(worker, ws, "alice")
        const mcp = yield* client(ws, "alice")
        const [ext] = yield* extensionsUntil(mcp, (l) => l.length === 1)
        expect(ext?.name).toMatch(/^Chrome \d+$/)
        yield* attach(mcp, ext!.id)

        const created = yield* ok(mcp, "createTab", { url: `${pages}/control.html` })
        const tabId = created["tabId"] as number
        expect(created).toMatchObject({ tabId: expect.any(Number), url: `${pages}/control.html`, title: "Control", tab: { id: tabId } })
        const { tabs } = (yield* ok(mcp, "getTabs")) as { tabs: Array<{ id: number; url: string; selected: boolean }> }
        expect(tabs).toContainEqual(expect.objectContaining({ id: tabId, url: `${pages}/control.html`, selected: true }))

        // Clicks and typing land in the page: the DOM changes, as CDP reads it back.
        expect(yield* ok(mcp, "click", { selector: "#go" })).toMatchObject({ clicked: true, tag: "button", tabId })
        yield* ok(mcp, "click", { selector: "#go" })
        expect(yield* evaluate(mcp, tabId, "document.getElementById('out').textContent")).toBe("clicked 2")
        expect(yield* ok(mcp, "type", { selector: "#name", text: "hello" })).toMatchObject({ typed: true, value: "hello" })
        expect(yield* ok(mcp, "type", { selector: "#name", text: " world" })).toMatchObject({ value: "hello world" })
        expect(yield* evaluate(mcp, tabId, "document.getElementById('echo').textContent")).toBe("hello world")
        // Hover is a real mouse move (trusted events, :hover), on an element scrolled into view first.
        expect(yield* ok(mcp, "hover", { selector: "#menu" })).toMatchObject({ hovered: true, tag: "p", tabId })
        expect(yield* evaluate(mcp, tabId, "[document.getElementById('menu').textContent, document.getElementById('menu').matches(':hover')]")).toEqual(["open", true])

        // A viewport screenshot is a PNG of the viewport's size.
        const viewport = yield* Effect.map(evaluate(mcp, tabId, "[innerWidth, innerHeight]"), (v) => v as [number, number])
        const shot = yield* ok(mcp, "screenshot", {})
        expect(shot["mimeType"]).toBe("image/png")
        expect(pngSize(Buffer.from(shot["data"] as string, "base64"))).toEqual({ width: viewport[0], height: viewport[1] })

        // Navigation, both ways through history; both names of navigate work.
        expect(yield* ok(mcp, "browser_navigate", { url: `${pages}/second.html` })).toMatchObject({ tabId, url: `${pages}/second.html`, title: "Second" })
        expect(yield* ok(mcp, "goBack", { tabId })).toMatchObject({ url: `${pages}/control.html` })
        expect(yield* ok(mcp, "goForward", {})).toMatchObject({ url: `${pages}/second.html` })
        expect(yield* ok(mcp, "navigate", { url: `${pages}/tall.html` })).toMatchObject({ title: "Tall" })

        // A full-page screenshot covers the whole document, beyond the viewport.
        const [width, height] = (yield* evaluate(mcp, tabId, "[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")) as [number, number]
        expect(height).toBeGreaterThan(viewport[1])
        const full = Buffer.from((yield* ok(mcp, "screenshot", { fullPage: true }))["data"] as string, "base64")
        expect(pngSize(full)).toEqual({ width, height })
        expect(full.length).toBeGreaterThan(1024 * 1024)

        expect(yield* ok(mcp, "closeTab", { tabId })).toEqual({ success: true, tabId })
        const after = (yield* ok(mcp, "getTabs")) as { tabs: Array<{ id: number }> }
        expect(after.tabs.map((t) => t.id)).not.toContain(tabId)
      })
    )

    it.scoped("answers what it cannot do with JSON-RPC errors a person can act on", () =>
      Effect.gen(function*() {
        const { extensionId, pages, worker } = yield* ExtensionBrowser
        const bus = yield* Layer.build(busLayer())
        const { ws } = yield* switchboard(bus, yield* freePort, extensionId)
        yield* configure(worker, ws, "bob")
        const mcp = yield* client(ws, "bob")
        const [ext] = yield* extensionsUntil(mcp, (l) => l.length === 1)
        yield* attach(mcp, ext!.id)
        const { tabId } = (yield* ok(mcp, "createTab", { url: `${pages}/control.html` })) as { tabId: number }

        expect(yield* request(mcp, "selectTab", { tabId: 987654 })).toEqual({ error: { code: -32000, message: "no tab 987654" } })
        expect(yield* request(mcp, "click", { selector: "#missing" })).toEqual({ error: { code: -32000, message: `no element matches "#missing" in tab ${tabId}` } })
        expect(yield* request(mcp, "click", { selector: "##" })).toEqual({ error: { code: -32000, message: `"##" is not a valid CSS selector in tab ${tabId}` } })
        expect(yield* request(mcp, "type", { selector: "#go", text: "x" })).toEqual({ error: { code: -32000, message: `"#go" is a <button>, which takes no text in tab ${tabId}` } })
        expect(yield* request(mcp, "click", {})).toEqual({ error: { code: -32602, message: "selector is required and must be a non-empty string" } })
        expect(yield* request(mcp, "goForward", {})).toMatchObject({ error: { message: `tab ${tabId} has no next page` } })
        expect(yield* request(mcp, "forwardCDPCommand", { method: "No.such" })).toMatchObject({ error: { message: expect.stringMatching(/^No\.such failed in tab \d+: .*wasn't found/) } })
        expect(yield* request(mcp, "drag", { selector: "#go" })).toMatchObject({ error: { code: -32601, message: expect.stringMatching(/^Method not found: drag \(this extension serves createTab, /) } })
        yield* ok(mcp, "closeTab", { tabId })
      })
    )
  })

  describe("MCP-B bridge", () => {
    it.scoped("a page's WebMCP tools reach the SDK client on /hub, run in their own tab, and follow list_changed; a second origin's same-named tool is its own", () =>
      Effect.gen(function*() {
        const { context, extensionId, otherOrigin, pages, worker } = yield* ExtensionBrowser
        const bus = yield* Layer.build(busLayer())
        const { ws } = yield* switchboard(bus, yield* freePort, extensionId)
        yield* configure(worker, ws, "dave")
        const shop = yield* open(context, `${pages}/shop.html`)
        const shopTab = yield* tabIdOf(worker, `${pages}/shop.html`)
        const { changes, client } = yield* hub(ws, "dave")

        // The tab's real id is in the name: the extension said hello with chrome.tabs' own.
        const search = toolName(pages, "search", shopTab)
        const [listed] = (yield* toolsUntil(client, (n) => n.includes(search))).filter((t) => t.name === search)
        expect(listed?.inputSchema).toMatchObject({ type: "object", properties: { q: { type: "string" } } })
        expect(textOf(yield* Effect.promise(() => client.callTool({ name: search, arguments: { q: "socks" } })))).toBe(`${new URL(pages).host} search:socks`)
        expect(yield* callsIn(shop)).toEqual(["search:socks"])

        // A tool the page registers later is announced with list_changed, and works.
        const heard = changes.length
        yield* Effect.promise(() => shop.evaluate(() => (window as unknown as { registerLater: () => Promise<void> }).registerLater()))
        const later = toolName(pages, "later", shopTab)
        yield* toolsUntil(client, (n) => n.includes(later))
        expect(changes.length).toBeGreaterThan(heard)
        expect(textOf(yield* Effect.promise(() => client.callTool({ name: later, arguments: {} })))).toBe(`${new URL(pages).host} later:`)

        // Another origin with a tool of the same name: both listed, each call reaches its own tab.
        const other = yield* open(context, `${otherOrigin}/shop.html`)
        const otherSearch = toolName(otherOrigin, "search", yield* tabIdOf(worker, `${otherOrigin}/shop.html`))
        const names = (yield* toolsUntil(client, (n) => n.includes(otherSearch))).map((t) => t.name)
        expect(names.filter((n) => n.endsWith("_search")).sort()).toEqual([search, otherSearch].sort())
        expect(textOf(yield* Effect.promise(() => client.callTool({ name: otherSearch, arguments: { q: "hats" } })))).toBe(`${new URL(otherOrigin).host} search:hats`)
        expect(textOf(yield* Effect.promise(() => client.callTool({ name: search, arguments: { q: "shoes" } })))).toBe(`${new URL(pages).host} search:shoes`)
        expect(yield* callsIn(other)).toEqual(["search:hats"])
        expect(yield* callsIn(shop)).toEqual(["search:socks", "later:", "search:shoes"])
      })
    )

    it.scoped("a tab's socket carries no token in its URL: the extension authenticates with a first message", () =>
      Effect.gen(function*() {
        const { context, extensionId, pages, worker } = yield* ExtensionBrowser
        const bus = yield* Layer.build(busLayer())
        const port = yield* freePort
        const { ws } = yield* switchboard(bus, port, extensionId)
        // The extension reaches the edge only through the relay, which sees every URL it opens.
        const relay = yield* recordingRelay(port)
        yield* configure(worker, relay.ws, "quinn")
        yield* open(context, `${pages}/shop.html`)
        const search = toolName(pages, "search", yield* tabIdOf(worker, `${pages}/shop.html`))
        const { client } = yield* hub(ws, "quinn")
        yield* toolsUntil(client, (n) => n.includes(search))
        expect(textOf(yield* Effect.promise(() => client.callTool({ name: search, arguments: { q: "boots" } })))).toBe(`${new URL(pages).host} search:boots`)
        const tabs = relay.targets.filter((t) => t.startsWith("/tabs"))
        expect(tabs.length).toBeGreaterThan(0)
        expect(tabs.filter((t) => t !== "/tabs")).toEqual([])
        expect(relay.targets.filter((t) => t.includes("token"))).toEqual([])
      })
    )

    it.scoped("a call's progress reaches the client, and its cancellation reaches the page", () =>
      Effect.gen(function*() {
        const { context, extensionId, pages, worker } = yield* ExtensionBrowser
        const bus = yield* Layer.build(busLayer())
        const { ws } = yield* switchboard(bus, yield* freePort, extensionId)
        yield* configure(worker, ws, "mia")
        const page = yield* open(context, `${pages}/long.html`)
        const long = toolName(pages, "long", yield* tabIdOf(worker, `${pages}/long.html`))
        const { client } = yield* hub(ws, "mia")
        yield* toolsUntil(client, (n) => n.includes(long))

        const reports: Array<Progress> = []
        const call = client.callTool({ name: long, arguments: {} }, undefined, { onprogress: (p) => void reports.push(p) })
        yield* Effect.promise(() => page.waitForFunction(() => typeof Reflect.get(window, "release") === "function"))
        yield* Effect.promise(() => page.evaluate(() => (Reflect.get(window, "release") as () => void)()))
        expect(textOf(yield* Effect.promise(() => call))).toBe("done")
        expect(reports).toEqual([{ progress: 1, total: 3 }, { progress: 2, total: 3 }, { progress: 3, total: 3 }])

        const abort = new AbortController()
        const cancelled = client.callTool({ name: long, arguments: {} }, undefined, { signal: abort.signal }).then(() => "answered", () => "rejected")
        yield* Effect.promise(() => page.waitForFunction(() => (Reflect.get(window, "calls") as Array<string>).length === 2))
        abort.abort("no longer needed")
        expect(yield* Effect.promise(() => cancelled)).toBe("rejected")
        yield* Effect.promise(() => page.waitForFunction(() => (Reflect.get(window, "cancelled") as Array<string>).length === 1))
      })
    )

    it.scoped("a page with only document.modelContext (the WebMCP polyfill, no MCP-B transport) is found through it", () =>
      Effect.gen(function*() {
        const { context, extensionId, pages, worker } = yield* ExtensionBrowser
        const bus = yield* Layer.build(busLayer())
        const { ws } = yield* switchboard(bus, yield* freePort, extensionId)
        yield* configure(worker, ws, "erin")
        const page = yield* open(context, `${pages}/polyfill.html`)
        const tabId = yield* tabIdOf(worker, `${pages}/polyfill.html`)
        const { client } = yield* hub(ws, "erin")
        const lookup = toolName(pages, "lookup", tabId)
        yield* toolsUntil(client, (n) => n.includes(lookup))
        expect(textOf(yield* Effect.promise(() => client.callTool({ name: lookup, arguments: { q: "x" } })))).toBe(`${new URL(pages).host} lookup:x`)
        yield* Effect.promise(() => page.evaluate(() => (window as unknown as { registerLater: () => Promise<void> }).registerLater()))
        yield* toolsUntil(client, (n) => n.includes(toolName(pages, "later", tabId)))
        expect(yield* callsIn(page)).toEqual(["lookup:x"])
      })
    )

    it.scoped("a closed tab's tools disappear unless cached; calling a cached one opens its page again through the proxy", () =>
      Effect.gen(function*() {
        const { context, extensionId, pages, worker } = yield* ExtensionBrowser
        const bus = yield* Layer.build(busLayer())
        const { ws } = yield* switchboard(bus, yield* freePort, extensionId)
        yield* configure(worker, ws, "frank")
        const url = `${pages}/orders.html`
        const first = yield* open(context, url)
        const tabId = yield* tabIdOf(worker, url)
        const { client } = yield* hub(ws, "frank")
        const cached = toolName(pages, "orders")
        yield* toolsUntil(client, (n) => [cached, toolName(pages, "orders", tabId), toolName(pages, "track", tabId)].every((t) => n.includes(t)))

        yield* Effect.promise(() => first.close())
        const left = yield* toolsUntil(client, (n) => !n.some((t) => t.includes(`_tab${tabId}_`)))
        expect(left.map((t) => t.name).filter((n) => n.includes(new URL(pages).host.replace(/[^a-zA-Z0-9_]/g, "_")))).toEqual([cached])

        // No tab has it: the registry asks the extension (createTab through the proxy) to open one.
        const opened = Effect.promise(() => context.waitForEvent("page", { predicate: (p) => p.url() === url, timeout: 15_000 }))
        const [answer, reopened] = yield* Effect.all([Effect.promise(() => client.callTool({ name: cached, arguments: {} })), opened], { concurrency: 2 })
        expect(textOf(answer)).toBe(`${new URL(pages).host} orders`)
        expect(yield* callsIn(reopened)).toEqual(["orders"])
        yield* Effect.promise(() => reopened.close())
      })
    )

    it.scoped("tab activation and navigation reach the registry: a domain's tool goes to the tab brought to the front, a navigated tab lists its new page's tools", () =>
      Effect.gen(function*() {
        const { context, extensionId, pages, worker } = yield* ExtensionBrowser
        const bus = yield* Layer.build(busLayer())
        const { ws } = yield* switchboard(bus, yield* freePort, extensionId)
        yield* configure(worker, ws, "heidi")
        const one = yield* open(context, `${pages}/orders.html?one`)
        const two = yield* open(context, `${pages}/orders.html?two`)
        const [oneTab, twoTab] = [yield* tabIdOf(worker, `${pages}/orders.html?one`), yield* tabIdOf(worker, `${pages}/orders.html?two`)]
        const { client } = yield* hub(ws, "heidi")
        yield* toolsUntil(client, (n) => [oneTab, twoTab].every((id) => n.includes(toolName(pages, "orders", id))))
        const cached = toolName(pages, "orders")
        const callCached = Effect.promise(() => client.callTool({ name: cached, arguments: {} }))

        for (const [front, back] of [[one, two], [two, one], [one, two]] as const) {
          const before = [(yield* callsIn(front)).length, (yield* callsIn(back)).length]
          yield* Effect.promise(() => front.bringToFront())
          // The registry hears of it through the bridge; a call routed before then goes to the other tab.
          yield* Effect.promise(() => client.listTools()).pipe(
            Effect.map(({ tools }) => tools.find((t) => t.name === toolName(pages, "orders", front === one ? oneTab : twoTab))?.description ?? ""),
            Effect.filterOrFail((d) => d.includes("active"), () => "not active yet"),
            Effect.retry({ times: 200, schedule: Schedule.spaced("25 millis") }),
            Effect.orDie
          )
          yield* callCached
          expect([(yield* callsIn(front)).length, (yield* callsIn(back)).length]).toEqual([before[0]! + 1, before[1]])
        }

        // Navigating a tab to another page of the origin: its old page's tools go, the new page's come, same tab.
        yield* Effect.promise(() => two.goto(`${pages}/shop.html`))
        yield* toolsUntil(client, (n) => n.includes(toolName(pages, "search", twoTab)) && !n.includes(toolName(pages, "track", twoTab)))
      })
    )

    it.scoped("frames of another origin get nothing relayed: forged readies, forged answers", () =>
      Effect.gen(function*() {
        const { context, extensionId, otherOrigin, pages, worker } = yield* ExtensionBrowser
        const bus = yield* Layer.build(busLayer())
        const { ws } = yield* switchboard(bus, yield* freePort, extensionId)
        yield* configure(worker, ws, "grace")
        const forger = encodeURIComponent(`${otherOrigin}/forger.html`)
        // Only the frame claims a server: the bridge must not even start a session.
        const quiet = yield* open(context, `${pages}/hostile.html?forger=${forger}`)
        // The page claims one itself (its right), but every answer comes from the frame.
        const announcing = yield* open(context, `${pages}/hostile.html?forger=${forger}#announce`)
        yield* Effect.promise(() => announcing.waitForFunction(() => Reflect.get(window, "forged") !== undefined))

        // A real page opened after them is relayed: the bridge and the registry are working.
        yield* open(context, `${pages}/shop.html`)
        const { client } = yield* hub(ws, "grace")
        const tools = yield* toolsUntil(client, (n) => n.some((t) => t.endsWith("_search")))
        expect(tools.map((t) => t.name).filter((n) => !n.endsWith("_search"))).toEqual([])
        expect((yield* pageValue<Array<unknown>>(quiet, "seen")).every((p) => p === "mcp-check-ready")).toBe(true)
        const seen = yield* pageValue<Array<unknown>>(announcing, "seen")
        // It asked the page (which never answered itself), and got no further on the frame's answers.
        expect(seen.filter((p) => p !== "mcp-check-ready")).toEqual([expect.objectContaining({ method: "initialize" })])
      })
    )
  })

  it.scoped("the popup sets the server URL and token, then shows the connection and the tabs that serve tools", () =>
    Effect.gen(function*() {
      const { context, extensionId, pages, worker } = yield* ExtensionBrowser
      const bus = yield* Layer.build(busLayer())
      const { ws } = yield* switchboard(bus, yield* freePort, extensionId)
      yield* setStorage(worker, { [Keys.serverUrl]: "", [Keys.token]: "" })
      const popup = yield* open(context, `chrome-extension://${extensionId}/popup.html`)
      yield* Effect.promise(() => popup.locator("#state").getByText("Not configured").waitFor({ timeout: 5_000 }))
      yield* Effect.promise(async () => {
        await popup.fill("#serverUrl", ws.replace("ws://", "http://"))
        await popup.fill("#token", await Effect.runPromise(token({ sub: "ivan" })))
        await popup.click("button[type=submit]")
      })
      const mcp = yield* client(ws, "ivan")
      const [ext] = yield* extensionsUntil(mcp, (l) => l.length === 1)
      yield* Effect.promise(() => popup.locator("#state").getByText(`Connected to ${new URL(ws.replace("ws", "http")).origin} as ivan (extension ${ext!.id})`).waitFor({ timeout: 5_000 }))

      const shop = yield* open(context, `${pages}/shop.html`)
      yield* Effect.promise(() => popup.locator("#tabs").getByText("1: search").waitFor({ timeout: 5_000 }))
      yield* Effect.promise(() => shop.evaluate(() => (window as unknown as { registerLater: () => Promise<void> }).registerLater()))
      yield* Effect.promise(() => popup.locator("#tabs").getByText("2: search, later").waitFor({ timeout: 5_000 }))
      expect(yield* Effect.promise(() => popup.locator("#tabs td").first().textContent())).toBe("Shop")
    })
  )

  it.scoped("the stdio bridge (switchboard-mcp) drives the real extension: it opens a WebMCP page, uses the page's tool, clicks and screenshots", () =>
    Effect.gen(function*() {
      const { extensionId, pages, worker } = yield* ExtensionBrowser
      const bus = yield* Layer.build(busLayer())
      const { ws } = yield* switchboard(bus, yield* freePort, extensionId)
      yield* configure(worker, ws, "kim")
      const mcp = yield* client(ws, "kim")
      yield* extensionsUntil(mcp, (l) => l.length === 1)
      // The MCP host: the SDK's client with switchboard-mcp as its child process, as a desktop app runs it.
      const root = fileURLToPath(new URL("../../", import.meta.url))
      const accessToken = yield* token({ sub: "kim" })
      const host = yield* Effect.acquireRelease(
        Effect.promise(async () => {
          const transport = new StdioClientTransport({
            command: process.execPath,
            args: [`${root}clients/cli/bin/switchboard-mcp.js`, "--url", ws.replace("ws://", "http://"), "--token", accessToken],
            stderr: "ignore",
            cwd: root
          })
          const host = new Client({ name: "test-host", version: "0.0.0" })
          await host.connect(transport)
          return host
        }),
        (host) => Effect.promise(() => host.close())
      )
      const attempt = (name: string, args: Record<string, unknown> = {}) => Effect.promise(() => host.callTool({ name, arguments: args }) as Promise<CallToolResult>)
      const use = (name: string, args: Record<string, unknown> = {}) =>
        attempt(name, args).pipe(Effect.tap((r) => (r.isError === true ? Effect.dieMessage(`${name} failed: ${JSON.stringify(r.content)}`) : Effect.void)))

      // The bridge connects to Switchboard after the host's initialize; until then it says it is unreachable.
      yield* attempt("browser_get_tabs").pipe(
        Effect.filterOrFail((r) => r.isError !== true, () => "still unreachable"),
        Effect.retry({ times: 100, schedule: Schedule.spaced("50 millis") }),
        Effect.orDie
      )
      const opened = JSON.parse(textOf(yield* use("browser_create_tab", { url: `${pages}/shop.html` })) ?? "{}") as { tabId: number }
      const search = toolName(pages, "search", opened.tabId)
      yield* toolsUntil(host, (n) => n.includes(search))
      expect(textOf(yield* use(search, { q: "boots" }))).toBe(`${new URL(pages).host} search:boots`)

      yield* use("browser_navigate", { url: `${pages}/control.html` })
      yield* use("browser_click", { selector: "#go" })
      yield* use("browser_type", { selector: "#name", text: "via stdio" })
      const read = yield* use("browser_cdp", { method: "Runtime.evaluate", params: { expression: "document.getElementById('out').textContent + '/' + document.getElementById('echo').textContent", returnByValue: true } })
      expect(JSON.parse(textOf(read) ?? "{}")).toMatchObject({ result: { value: "clicked 1/via stdio" } })
      const shot = yield* use("browser_screenshot", {})
      const image = shot.content[0]
      expect(image?.type).toBe("image")
      expect(pngSize(Buffer.from(image?.type === "image" ? image.data : "", "base64"))).toMatchObject({ width: expect.any(Number) })
      expect(JSON.parse(textOf(yield* use("browser_get_tabs")) ?? "{}")).toMatchObject({ tabs: expect.arrayContaining([expect.objectContaining({ id: opened.tabId, url: `${pages}/control.html` })]) })
      yield* use("browser_close_tab", { tabId: opened.tabId })
    })
  )

  it.scoped("across two edges on one bus: the extension on one, the MCP clients on the other", () =>
    Effect.gen(function*() {
      const { context, extensionId, pages, worker } = yield* ExtensionBrowser
      const bus = yield* Layer.build(busLayer())
      const browserSide = yield* switchboard(bus, yield* freePort, extensionId)
      const clientSide = yield* switchboard(bus, yield* freePort, extensionId)
      yield* configure(worker, browserSide.ws, "leo")
      const mcp = yield* client(clientSide.ws, "leo")
      const [ext] = yield* extensionsUntil(mcp, (l) => l.length === 1)
      yield* attach(mcp, ext!.id)
      const { tabId } = (yield* ok(mcp, "createTab", { url: `${pages}/shop.html` })) as { tabId: number }
      const { client: hubClient } = yield* hub(clientSide.ws, "leo")
      const search = toolName(pages, "search", tabId)
      yield* toolsUntil(hubClient, (n) => n.includes(search))
      expect(textOf(yield* Effect.promise(() => hubClient.callTool({ name: search, arguments: { q: "far" } })))).toBe(`${new URL(pages).host} search:far`)
      const shop = context.pages().find((p) => p.url() === `${pages}/shop.html`)
      expect(yield* callsIn(shop!)).toEqual(["search:far"])
      yield* ok(mcp, "closeTab", { tabId })
    })
  )

  it.scoped("reconnects on its own after the server restarts, under the same extension_id", () =>
    Effect.gen(function*() {
      const { extensionId, worker } = yield* ExtensionBrowser
      // The bus outlives the server, as NATS outlives a Switchboard process.
      const bus = yield* Layer.build(busLayer())
      const port = yield* freePort
      const first = yield* switchboard(bus, port, extensionId)
      yield* configure(worker, first.ws, "carol")
      const before = yield* Effect.flatMap(client(first.ws, "carol"), (mcp) => extensionsUntil(mcp, (l) => l.length === 1))
      yield* first.stop

      const second = yield* switchboard(bus, port, extensionId)
      const mcp = yield* client(second.ws, "carol")
      const after = yield* extensionsUntil(mcp, (l) => l.length === 1)
      expect(after[0]?.id).toBe(before[0]?.id)
      // And it serves requests again.
      yield* attach(mcp, after[0]!.id)
      expect(yield* ok(mcp, "getTabs")).toMatchObject({ tabs: expect.any(Array) })
      yield* second.stop
    })
  )

  it.scoped(
    "survives the suspension of its service worker: a page wakes it, so does its alarm alone, and it comes back under the same extension_id",
    () =>
      Effect.gen(function*() {
        const { context, extensionId, pages, worker } = yield* ExtensionBrowser
        const bus = yield* Layer.build(busLayer())
        const { ws } = yield* switchboard(bus, yield* freePort, extensionId)
        yield* configure(worker, ws, "judy")
        const mcp = yield* client(ws, "judy")
        const [ext] = yield* extensionsUntil(mcp, (l) => l.length === 1)
        // What Chrome does to an idle MV3 worker, done on demand from chrome://serviceworker-internals.
        const internals = yield* open(context, "chrome://serviceworker-internals/")
        const status = () => internals.evaluate(() => document.body.innerText.match(/Running Status: (\w+)/)?.[1])
        const suspend = Effect.gen(function*() {
          yield* Effect.promise(async () => {
            await internals.reload()
            await internals.waitForFunction(() => /Running Status: RUNNING/.test(document.body.innerText))
            await internals.getByText("Stop", { exact: true }).first().click()
          })
          yield* Effect.promise(status).pipe(
            Effect.filterOrFail((s) => s === "STOPPED", () => "still running"),
            Effect.retry({ times: 100, schedule: Schedule.spaced("50 millis") }),
            Effect.orDie
          )
          // Its socket closed with it.
          yield* extensionsUntil(mcp, (l) => l.length === 0)
        })

        // A WebMCP page's content script wakes it: the proxy session and the page's tools are back.
        yield* suspend
        const shop = yield* open(context, `${pages}/shop.html`)
        expect((yield* extensionsUntil(mcp, (l) => l.length === 1))[0]?.id).toBe(ext!.id)
        const { client: hubClient } = yield* hub(ws, "judy")
        yield* toolsUntil(hubClient, (n) => n.some((t) => t.endsWith("_search")))

        // With no page to wake it (a page's bridge reconnects to a worker that went away), only the
        // alarm (every 30 s) does, and it reconnects.
        yield* Effect.promise(() => shop.close())
        yield* suspend
        expect((yield* extensionsUntil(mcp, (l) => l.length === 1, 45))[0]?.id).toBe(ext!.id)
        expect(yield* Effect.promise(status)).toBe("RUNNING")
        const page = yield* open(context, `chrome-extension://${extensionId}/popup.html`)
        const alarm = yield* Effect.promise(() => page.evaluate(() => (globalThis as unknown as ExtensionGlobals).chrome.alarms.get("switchboard-keepalive")))
        expect(alarm?.periodInMinutes).toBe(0.5)
      }),
    90_000
  )
})
