/**
 * Chrome's own WebMCP (Chromium with `--enable-features=WebMCPTesting`, shared/BROWSER.md) through
 * the real extension to the SDK's client on `/hub`. The pages use only the browser's native
 * `document.modelContext`: imperative tools (`registerTool`, removed with their `AbortSignal`) and
 * declarative forms (`<form toolname>`). An `@mcp-b/global` page in the same browser still works.
 * The polyfill's string-taking `executeTool` is covered by extension.test.ts, whose browser has no
 * native API.
 */
import { describe, expect, layer } from "@effect/vitest"
import type { Bus, Journal, Kv } from "@switchboard/bus"
import { buildExtension } from "@switchboard/extension/build"
import { Keys } from "@switchboard/extension/keys"
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js"
import { Registry } from "@switchboard/registry"
import { Router } from "@switchboard/router"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { readFile } from "node:fs/promises"
import { createRequire } from "node:module"
import type { BrowserContext, Page, Worker } from "playwright-core"
import { launch } from "./support/Browser.ts"
import { pageServer, tempDir } from "./support/ExtensionHarness.ts"
import { freePort } from "./support/FreePort.ts"
import { stack, token } from "./support/Stack.ts"
import { busLayer } from "./support/Stack.ts"
import { hub, textOf, toolsUntil } from "./support/Tabs.ts"

/**
 * Imperative tools with the native API only: `add` computes its answer from its arguments, `shout`
 * returns a plain string, `fail` throws, `leave` navigates and never answers; `window.registerLater()` adds `later`, and
 * `window.removeAdd()` aborts `add`'s registration signal.
 */
const nativePage = `<!doctype html><title>Native</title>
<script>
  window.calls = []
  const mc = document.modelContext
  const registration = new AbortController()
  mc.registerTool({
    name: "add", description: "adds two numbers",
    inputSchema: { type: "object", properties: { a: { type: "number" }, b: { type: "number" } }, required: ["a", "b"] },
    execute({ a, b }) {
      window.calls.push("add:" + a + "," + b)
      return { content: [{ type: "text", text: a + " + " + b + " = " + (a + b) }] }
    }
  }, { signal: registration.signal })
  mc.registerTool({ name: "shout", description: "upper-cases its text", inputSchema: { type: "object", properties: { text: { type: "string" } } }, execute: ({ text }) => text.toUpperCase() })
  mc.registerTool({ name: "fail", description: "always fails", execute() { throw new Error("out of stock") } })
  mc.registerTool({ name: "leave", description: "navigates away and never answers", execute() { location.assign("/results.html?q=left"); return new Promise(() => {}) } })
  window.registerLater = () => mc.registerTool({ name: "later", description: "registered after load", execute: (args) => "later with " + JSON.stringify(args) })
  window.removeAdd = () => registration.abort()
</script>`

const webmcpGlobalPage = `<!doctype html><title>Global</title>
<script src="/global.js"></script>
<script>
  document.modelContext.registerTool({
    name: "search", description: "search on " + location.host,
    inputSchema: { type: "object", properties: { q: { type: "string" } } },
    async execute(args) { return { content: [{ type: "text", text: "global search:" + (args.q ?? "") }] } }
  })
</script>`

/**
 * Declarative tools, native only: `book` submits itself and answers through `respondWith`;
 * `contact` (no `toolautosubmit`) waits for the person's submit, then answers the same way;
 * `find` submits itself with no handler, so the form navigates to `/results.html`, a page with a
 * tool of its own.
 */
const formsPage = `<!doctype html><title>Forms</title>
<form id="book" toolname="book" tooldescription="Books a table" toolautosubmit>
  <input name="who" toolparamdescription="whose name the table is under">
  <input name="guests" type="number" toolparamdescription="how many people">
</form>
<form id="contact" toolname="contact" tooldescription="Sends a message to the shop">
  <input name="message" toolparamdescription="the message">
  <button id="send">Send</button>
</form>
<form id="find" toolname="find" tooldescription="Finds products" toolautosubmit action="/results.html">
  <input name="q" toolparamdescription="what to look for">
</form>
<script>
  window.submits = []
  for (const form of document.forms) form.addEventListener("submit", (event) => {
    window.submits.push(form.id + ":" + event.agentInvoked)
    if (form.id === "find") return
    event.preventDefault()
    const data = new FormData(form)
    event.respondWith(form.id === "book" ? { booked: data.get("who"), guests: Number(data.get("guests")) } : "sent: " + data.get("message"))
  })
</script>`

const resultsPage = `<!doctype html><title>Results</title>
<script>
  document.modelContext.registerTool({ name: "results", description: "the results shown", execute: () => "results for " + new URLSearchParams(location.search).get("q") })
</script>`

const require = createRequire(import.meta.url)

interface Harness {
  readonly context: BrowserContext
  readonly worker: Worker
  readonly extensionId: string
  readonly pages: string
}
class NativeBrowser extends Context.Tag("test/NativeBrowser")<NativeBrowser, Harness>() {}

/** One browser for the file, with Chrome's native WebMCP on, the extension built afresh, and the local pages. */
const browser = Layer.scoped(
  NativeBrowser,
  Effect.gen(function*() {
    const dir = yield* tempDir("sb-extension-")
    yield* Effect.promise(() => buildExtension(dir))
    const context = yield* launch({ args: ["--enable-features=WebMCPTesting", `--disable-extensions-except=${dir}`, `--load-extension=${dir}`] })
    const worker = context.serviceWorkers()[0] ?? (yield* Effect.promise(() => context.waitForEvent("serviceworker", { timeout: 10_000 })))
    const global = yield* Effect.promise(() => readFile(require.resolve("@mcp-b/global/iife"), "utf8"))
    const pages = yield* pageServer({ "/native.html": nativePage, "/forms.html": formsPage, "/results.html": resultsPage, "/global.js": global, "/global.html": webmcpGlobalPage })
    return { context, worker, extensionId: new URL(worker.url()).host, pages }
  })
)

/** A Switchboard (edge, router and registry) for the test, on its own bus namespace. */
const switchboard = (extensionId: string) =>
  Effect.gen(function*() {
    const port = yield* freePort
    const bus = yield* Layer.build(busLayer())
    yield* Layer.build(
      stack(Layer.succeedContext(bus as Context.Context<Bus.Bus | Kv.Kv | Journal.Journal>), {
        services: Layer.mergeAll(Router.layer, Registry.layer),
        env: { PORT: String(port), ALLOWED_ORIGINS: `chrome-extension://${extensionId}` }
      })
    )
    return `ws://127.0.0.1:${port}`
  })

/** Points the extension at `ws` as `user`, from its service worker: it connects as soon as both keys are set. */
const configure = (worker: Worker, ws: string, user: string) =>
  Effect.flatMap(token({ sub: user }), (t) =>
    Effect.promise(() =>
      worker.evaluate(
        (items) => (globalThis as unknown as { chrome: { storage: { local: { set(i: Record<string, string>): Promise<void> } } } }).chrome.storage.local.set(items),
        { [Keys.serverUrl]: ws.replace("ws://", "http://"), [Keys.token]: t }
      )
    ))

/** Opens `url` in a new tab; closed with the scope. */
const open = (context: BrowserContext, url: string) =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const page = await context.newPage()
      await page.goto(url)
      return page
    }),
    (page) => Effect.promise(() => page.close().catch(() => undefined))
  )

/** The id Chrome gave the tab showing `url`. */
const tabIdOf = (worker: Worker, url: string) =>
  Effect.flatMap(
    Effect.promise(() =>
      worker.evaluate(
        async (u) => (await (globalThis as unknown as { chrome: { tabs: { query(f: { url: string }): Promise<Array<{ id?: number }>> } } }).chrome.tabs.query({ url: u }))[0]?.id,
        url
      )
    ),
    (id) => (id === undefined ? Effect.dieMessage(`no tab shows ${url}`) : Effect.succeed(id))
  )

/** The registry's name for a tool of a tab. */
const toolName = (base: string, tool: string, tabId: number) => `website_tool_${new URL(base).host.replace(/[^a-zA-Z0-9_]/g, "_")}_tab${tabId}_${tool}`

const pageValue = <A>(page: Page, name: string) => Effect.promise(() => page.evaluate((n) => Reflect.get(window, n) as A, name))

/** A page of the harness in a tab, the SDK's client on `/hub`, and the registry's name for the page's tools. */
const tabWithHub = (path: string, user: string) =>
  Effect.gen(function*() {
    const { context, extensionId, pages, worker } = yield* NativeBrowser
    const ws = yield* switchboard(extensionId)
    yield* configure(worker, ws, user)
    const page = yield* open(context, `${pages}${path}`)
    const tabId = yield* tabIdOf(worker, `${pages}${path}`)
    const { client } = yield* hub(ws, user)
    const call = (tool: string, args: Record<string, unknown> = {}) =>
      Effect.promise(() => client.callTool({ name: toolName(pages, tool, tabId), arguments: args }) as Promise<CallToolResult>)
    return { client, page, call, name: (tool: string) => toolName(pages, tool, tabId) }
  })

layer(browser, { excludeTestServices: true, timeout: "60 seconds" })("Chrome's native WebMCP", (it) => {
  describe("imperative tools", () => {
    it.scoped("a native tool's answer is computed from the arguments the /hub client sent; a plain string and a thrown error come back as MCP results", () =>
      Effect.gen(function*() {
        const { call, client, name, page } = yield* tabWithHub("/native.html", "nadia")
        const [add] = (yield* toolsUntil(client, (n) => ["add", "shout", "fail"].every((t) => n.includes(name(t))))).filter((t) => t.name === name("add"))
        expect(add?.inputSchema).toMatchObject({ type: "object", properties: { a: { type: "number" }, b: { type: "number" } } })

        const sum = yield* call("add", { a: 2, b: 40 })
        expect(sum.isError).not.toBe(true)
        expect(textOf(sum)).toBe("2 + 40 = 42")
        expect(yield* pageValue<Array<string>>(page, "calls")).toEqual(["add:2,40"])
        expect(textOf(yield* call("shout", { text: "quiet" }))).toBe("QUIET")

        const failed = yield* call("fail")
        expect(failed.isError).toBe(true)
        expect(textOf(failed)).toMatch(/invocation failed/)
      })
    )

    it.scoped("a tool registered after load appears at /hub and answers; one removed with its AbortSignal disappears", () =>
      Effect.gen(function*() {
        const { call, client, name, page } = yield* tabWithHub("/native.html", "otto")
        yield* toolsUntil(client, (n) => n.includes(name("add")))

        yield* Effect.promise(() => page.evaluate(() => (Reflect.get(window, "registerLater") as () => Promise<void>)()))
        yield* toolsUntil(client, (n) => n.includes(name("later")))
        expect(textOf(yield* call("later", { n: 1 }))).toBe(`later with {"n":1}`)

        yield* Effect.promise(() => page.evaluate(() => (Reflect.get(window, "removeAdd") as () => void)()))
        const left = (yield* toolsUntil(client, (n) => !n.includes(name("add")))).map((t) => t.name)
        expect(left).toEqual(expect.arrayContaining([name("later"), name("shout"), name("fail")]))
      })
    )

    it.scoped("an @mcp-b/global page in the same browser is still served through its own tab transport", () =>
      Effect.gen(function*() {
        const { call, client, name } = yield* tabWithHub("/global.html", "gita")
        yield* toolsUntil(client, (n) => n.includes(name("search")))
        expect(textOf(yield* call("search", { q: "tea" }))).toBe("global search:tea")
      })
    )
    it.scoped("a call under way when its page navigates away is answered as such, not left waiting", () =>
      Effect.gen(function*() {
        const { call, client, name, page } = yield* tabWithHub("/native.html", "pia")
        yield* toolsUntil(client, (n) => n.includes(name("leave")))
        const left = yield* call("leave")
        expect(left.isError).not.toBe(true)
        expect(textOf(left)).toMatch(/^The page http:\/\/127\.0\.0\.1:\d+\/native\.html went away \(it navigated or was closed\) before the tool answered\./)
        yield* Effect.promise(() => page.waitForURL(/\/results\.html\?q=left$/))
        yield* toolsUntil(client, (n) => n.includes(name("results")))
      })
    )
  })

  describe("declarative forms", () => {
    it.scoped("a toolautosubmit form is filled from the arguments, submitted by Chrome with agentInvoked, and answers through respondWith", () =>
      Effect.gen(function*() {
        const { call, client, name, page } = yield* tabWithHub("/forms.html", "bea")
        const [book] = (yield* toolsUntil(client, (n) => n.includes(name("book")))).filter((t) => t.name === name("book"))
        expect(book?.description).toMatch(/Books a table$/)
        expect(book?.inputSchema).toMatchObject({ type: "object", properties: { who: { type: "string", description: "whose name the table is under" }, guests: { type: "number" } } })

        const booked = yield* call("book", { who: "Ada", guests: 3 })
        expect(booked.isError).not.toBe(true)
        expect(JSON.parse(textOf(booked) ?? "null")).toEqual({ booked: "Ada", guests: 3 })
        expect(yield* pageValue<Array<string>>(page, "submits")).toEqual(["book:true"])
      })
    )

    it.scoped("a form without toolautosubmit is filled, waits for the person's submit, and answers it", () =>
      Effect.gen(function*() {
        const { call, client, name, page } = yield* tabWithHub("/forms.html", "cleo")
        yield* toolsUntil(client, (n) => n.includes(name("contact")))
        const answer = yield* Effect.fork(call("contact", { message: "is it open on Sunday?" }))
        // Filled, and nothing sent until the person presses Send.
        yield* Effect.promise(() => page.waitForFunction(() => (document.querySelector("#contact input") as HTMLInputElement).value === "is it open on Sunday?"))
        expect(yield* pageValue<Array<string>>(page, "submits")).toEqual([])
        yield* Effect.promise(() => page.click("#send"))
        expect(textOf(yield* answer.await.pipe(Effect.flatten))).toBe("sent: is it open on Sunday?")
        expect(yield* pageValue<Array<string>>(page, "submits")).toEqual(["contact:true"])
      })
    )

    it.scoped("a form that navigates answers with a clear result, not a hang, and the new page's tools register in the same tab", () =>
      Effect.gen(function*() {
        const { call, client, name, page } = yield* tabWithHub("/forms.html", "dora")
        yield* toolsUntil(client, (n) => n.includes(name("find")))
        const found = yield* call("find", { q: "lamps" })
        expect(found.isError).not.toBe(true)
        // The page's own word when it sees the navigation start; on a machine slow enough for the
        // page to be gone before that word is out, the content script's, from its pagehide.
        expect(textOf(found)).toMatch(
          /^(The form was submitted and the page navigated to http:\/\/127\.0\.0\.1:\d+\/results\.html\?q=lamps;|The page http:\/\/127\.0\.0\.1:\d+\/forms\.html went away \(it navigated or was closed\) before the tool answered)/
        )
        yield* Effect.promise(() => page.waitForURL(/\/results\.html\?q=lamps$/))
        yield* toolsUntil(client, (n) => n.includes(name("results")) && !n.includes(name("find")))
        expect(textOf(yield* call("results"))).toBe("results for lamps")
      })
    )
  })
})
