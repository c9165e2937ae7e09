/**
 * The browser extension (clients/extension) in real headless Chromium, serving the MCP Proxy
 * Protocol against a real Switchboard: an MCP client on `/mcp` opens a tab on a local page,
 * navigates, clicks, types, takes screenshots and sends raw CDP, all carried out by the
 * extension; errors come back as JSON-RPC errors a person can act on; and after the server
 * restarts the extension reconnects on its own under the same extension_id.
 */
import { describe, expect, layer } from "@effect/vitest"
import type { Bus, Journal, Kv } from "@switchboard/bus"
import { buildExtension } from "@switchboard/extension/build"
import { Keys } from "@switchboard/extension/keys"
import { Router } from "@switchboard/router"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Scope from "effect/Scope"
import { mkdtemp, rm } from "node:fs/promises"
import { createServer } from "node:http"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { BrowserContext, Worker } from "playwright-core"
import { type TestClient } from "./support/Client.ts"
import { launch } from "./support/Browser.ts"
import { freePort } from "./support/FreePort.ts"
import { attach, call, client, type Message } from "./support/ProxyPeers.ts"
import { busLayer, stack, token } from "./support/Stack.ts"

/** A fresh temporary directory, removed with the scope. */
const tempDir = (prefix: string) =>
  Effect.acquireRelease(
    Effect.promise(() => mkdtemp(join(tmpdir(), prefix))),
    (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
  )

/** Serves `pages` (path → HTML or script) on `host` at a free port for as long as the scope lives; its base URL. */
const pageServer = (pages: Readonly<Record<string, string>>, host = "127.0.0.1") =>
  Effect.acquireRelease(
    Effect.async<{ readonly url: string; readonly close: () => void }>((resume) => {
      const server = createServer((req, res) => {
        const path = new URL(req.url ?? "/", "http://x").pathname
        const body = pages[path]
        if (body === undefined) return void res.writeHead(404).end("not found")
        const type = path.endsWith(".js") ? "text/javascript" : "text/html; charset=utf-8"
        res.writeHead(200, { "content-type": type, "cache-control": "no-store" }).end(body)
      })
      server.listen(0, host, () => {
        const address = server.address()
        resume(Effect.succeed({ url: `http://${host}:${typeof address === "object" && address !== null ? address.port : 0}`, close: () => server.close() }))
      })
    }),
    (s) => Effect.sync(() => s.close())
  ).pipe(Effect.map((s) => s.url))

/** The extension's service worker, started with the browser, and the extension's id. */
const serviceWorker = (context: BrowserContext) =>
  Effect.promise(async () => {
    const worker = context.serviceWorkers()[0] ?? (await context.waitForEvent("serviceworker", { timeout: 10_000 }))
    return { worker, extensionId: new URL(worker.url()).host }
  })

interface ExtensionGlobals {
  readonly chrome: { readonly storage: { readonly local: { set(items: Record<string, string>): Promise<void> } } }
}

/** Writes `items` into the extension's `chrome.storage.local`, from its service worker, as a harness or policy would. */
const setStorage = (worker: Worker, items: Record<string, string>) =>
  Effect.promise(() => worker.evaluate((i) => (globalThis as unknown as ExtensionGlobals).chrome.storage.local.set(i), items))

const controlPage = `<!doctype html><title>Control</title>
<button id="go" onclick="document.getElementById('out').textContent = 'clicked ' + (++window.clicks)">Go</button>
<p id="out">idle</p>
<input id="name" oninput="document.getElementById('echo').textContent = this.value">
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

const pages = {
  "/control.html": controlPage,
  "/second.html": "<!doctype html><title>Second</title><p>second page</p>",
  "/tall.html": tallPage
}

/** Width and height from a PNG's IHDR, or undefined when it is not a PNG. */
const pngSize = (bytes: Buffer) =>
  bytes.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])) && bytes.subarray(12, 16).toString() === "IHDR"
    ? { width: bytes.readUInt32BE(16), height: bytes.readUInt32BE(20) }
    : undefined

interface Harness {
  readonly worker: Worker
  readonly extensionId: string
  readonly pages: string
}
class ExtensionBrowser extends Context.Tag("test/ExtensionBrowser")<ExtensionBrowser, Harness>() {}

/** One browser for the file: the extension built afresh, loaded unpacked, and the local pages. */
const browser = Layer.scoped(
  ExtensionBrowser,
  Effect.gen(function*() {
    const dir = yield* tempDir("sb-extension-")
    yield* Effect.promise(() => buildExtension(dir))
    const context = yield* launch({ args: [`--disable-extensions-except=${dir}`, `--load-extension=${dir}`] })
    const { worker, extensionId } = yield* serviceWorker(context)
    return { worker, extensionId, pages: yield* pageServer(pages) }
  })
)

/** A Switchboard with the proxy (router) on `port`, over an outside bus, that a test can stop and start again. */
const switchboard = (bus: Context.Context<Bus.Bus | Kv.Kv | Journal.Journal>, port: number, extensionId: string) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    yield* Layer.buildWithScope(
      stack(Layer.succeedContext(bus), { services: Router.layer, env: { PORT: String(port), ALLOWED_ORIGINS: `chrome-extension://${extensionId}` } }),
      scope
    )
    return { ws: `ws://127.0.0.1:${port}`, stop: Scope.close(scope, Exit.void) }
  })

/** Points the extension at `ws` as `user`: it connects as soon as both keys are set. */
const configure = (worker: Worker, ws: string, user: string) =>
  Effect.flatMap(token({ sub: user }), (t) => setStorage(worker, { [Keys.serverUrl]: ws.replace("ws://", "http://"), [Keys.token]: t }))

/** The extensions the proxy lists for `mcp`'s user, once `ok` holds of them (polled: nothing announces it). */
const extensionsUntil = (mcp: TestClient, ok: (list: ReadonlyArray<{ id: string; name: string }>) => boolean) =>
  Effect.gen(function*() {
    for (let i = 0; ; i++) {
      const answer = yield* call(mcp, `list-${i}`, "list_extensions")
      const list = (answer.result as { extensions: Array<{ id: string; name: string }> }).extensions
      if (ok(list)) return list
      if (i > 150) return yield* Effect.dieMessage(`list_extensions never matched; last: ${JSON.stringify(list)}`)
      yield* Effect.sleep("100 millis")
    }
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

layer(browser, { excludeTestServices: true, timeout: "60 seconds" })("browser extension: MCP Proxy Protocol", (it) => {
  describe("browser control", () => {
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
        expect(yield* request(mcp, "hover", { selector: "#go" })).toMatchObject({ error: { code: -32601, message: expect.stringMatching(/^Method not found: hover/) } })
        yield* ok(mcp, "closeTab", { tabId })
      })
    )
  })

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
})
