/**
 * A user's own browser as a CDP endpoint (`/cdp/{extension_id}`): the project's extension in real
 * headless Chromium connects to Switchboard as usual, and the unmodified Playwright client
 * (`chromium.connectOverCDP`, the pinned `playwright-core`) drives that browser through the
 * endpoint: it opens a page, navigates to a served page, evaluates, fills and clicks, hears a
 * console event, takes a screenshot and closes the page. Another user, and no token, get nothing.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Registry } from "@switchboard/registry"
import { NatsServer } from "@switchboard/testing"
import { Router } from "@switchboard/router"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Scope from "effect/Scope"
import { type Browser, chromium, type Worker } from "playwright-core"
import WebSocket from "ws"
import { configure, extensionsUntil, pageServer, pngSize, withExtension } from "./support/ExtensionHarness.ts"
import { freePort } from "./support/FreePort.ts"
import * as Processes from "./support/Processes.ts"
import { client } from "./support/ProxyPeers.ts"
import { busLayer, stack, token } from "./support/Stack.ts"

const pages = {
  "/control.html": `<!doctype html><title>Control</title>
<button id="go" onclick="document.getElementById('out').textContent = 'clicked ' + document.getElementById('name').value">Go</button>
<p id="out">idle</p>
<input id="name">`
}

interface Harness {
  readonly worker: Worker
  readonly extensionId: string
  readonly pages: string
}
class CdpBrowser extends Context.Tag("test/CdpBrowser")<CdpBrowser, Harness>() {}

/** One browser for the file, with the extension, and the pages it is driven to. */
const browser = Layer.scoped(
  CdpBrowser,
  Effect.gen(function*() {
    const { extensionId, worker } = yield* withExtension
    return { worker, extensionId, pages: yield* pageServer(pages) }
  })
)

/** A Switchboard (edge, router and registry) on a free port over the embedded bus; its ws:// base. */
const switchboard = (extensionId: string) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    yield* Effect.addFinalizer(() => Scope.close(scope, Exit.void))
    const port = yield* freePort
    yield* Layer.buildWithScope(
      stack(busLayer(), { services: Layer.mergeAll(Router.layer, Registry.layer), env: { PORT: String(port), ALLOWED_ORIGINS: `chrome-extension://${extensionId}` } }),
      scope
    )
    return `ws://127.0.0.1:${port}`
  })

/** Playwright connected over CDP to `endpoint` with `headers`; closed with the scope. */
const connectOverCDP = (endpoint: string, headers: Record<string, string>) =>
  Effect.acquireRelease(
    Effect.promise(() => chromium.connectOverCDP(endpoint, { headers, timeout: 30_000 })),
    (b: Browser) => Effect.promise(() => b.close().catch(() => undefined))
  )

/** How a WebSocket to `url` ends: the HTTP status of a refused upgrade, or the close code and reason. */
const refusal = (url: string, headers: Record<string, string> = {}) =>
  Effect.async<string>((resume) => {
    const ws = new WebSocket(url, { headers })
    ws.on("unexpected-response", (_req, res) => {
      resume(Effect.succeed(`HTTP ${res.statusCode}`))
      ws.terminate()
    })
    ws.on("close", (code, reason) => resume(Effect.succeed(`${code} ${reason.toString()}`)))
    ws.on("error", () => undefined)
  })

/**
 * What a Playwright user does in the browser at `endpoint`, as `user`: a new page, a served page,
 * evaluate, fill and click, a console event, a screenshot, and the page closed.
 */
const drive = (endpoint: string, user: string, pages: string) =>
  Effect.gen(function*() {
    const remote = yield* connectOverCDP(endpoint, { Authorization: `Bearer ${yield* token({ sub: user })}` })
    const context = remote.contexts()[0]
    expect(context).toBeDefined()
    const page = yield* Effect.promise(() => context!.newPage())
    yield* Effect.promise(() => page.goto(`${pages}/control.html`))
    expect(yield* Effect.promise(() => page.title())).toBe("Control")
    expect(yield* Effect.promise(() => page.evaluate(() => [1 + 1, location.pathname]))).toEqual([2, "/control.html"])

    yield* Effect.promise(() => page.fill("#name", "through Switchboard"))
    yield* Effect.promise(() => page.click("#go"))
    expect(yield* Effect.promise(() => page.textContent("#out"))).toBe("clicked through Switchboard")

    const logged = page.waitForEvent("console", { timeout: 30_000 })
    yield* Effect.promise(() => page.evaluate(() => console.log("hello from the page")))
    expect((yield* Effect.promise(() => logged)).text()).toBe("hello from the page")

    const viewport = yield* Effect.promise(() => page.evaluate(() => [innerWidth, innerHeight]))
    const shot = yield* Effect.promise(() => page.screenshot())
    expect(pngSize(shot)).toEqual({ width: viewport[0], height: viewport[1] })

    yield* Effect.promise(() => page.close())
    expect(context!.pages()).toHaveLength(0)
  })

/** The proxy's id of the extension, once it has connected to `ws` as `user`. */
const extensionIdAt = (ws: string, user: string) =>
  Effect.gen(function*() {
    const mcp = yield* client(ws, user)
    const [ext] = yield* extensionsUntil(mcp, (l) => l.length === 1)
    return ext!.id
  })

layer(browser, { excludeTestServices: true, timeout: "60 seconds" })("CDP endpoint", (it) => {
  describe("Playwright connectOverCDP", () => {
    it.scoped("drives a new page of the user's browser: goto, evaluate, fill, click, console, screenshot, close", () =>
      Effect.gen(function*() {
        const { extensionId, pages, worker } = yield* CdpBrowser
        const ws = yield* switchboard(extensionId)
        yield* configure(worker, ws, "alice")
        yield* drive(`${ws}/cdp/${yield* extensionIdAt(ws, "alice")}`, "alice", pages)
      }), 120_000)

    it.scoped("does the same through another edge than the extension's, with every service its own process on NATS", () =>
      Effect.gen(function*() {
        const { extensionId, pages, worker } = yield* CdpBrowser
        const { url } = yield* NatsServer
        const { edges: [a, b] } = yield* Processes.deployment(url, { edges: 2, env: { ALLOWED_ORIGINS: `chrome-extension://${extensionId}` } })
        if (a === undefined || b === undefined) return yield* Effect.dieMessage("the deployment has fewer than two edges")
        yield* configure(worker, a.ws, "bob")
        yield* drive(`${b.ws}/cdp/${yield* extensionIdAt(b.ws, "bob")}`, "bob", pages)
      }).pipe(Effect.provide(NatsServer.layer)), 180_000)

    it.scoped("refuses an upgrade without a token (401), and another user's extension id", () =>
      Effect.gen(function*() {
        const { extensionId, worker } = yield* CdpBrowser
        const ws = yield* switchboard(extensionId)
        yield* configure(worker, ws, "alice")
        const endpoint = `${ws}/cdp/${yield* extensionIdAt(ws, "alice")}`
        expect(yield* refusal(endpoint)).toBe("HTTP 401")
        expect(yield* refusal(endpoint, { Authorization: "Bearer not-a-token" })).toBe("HTTP 401")
        expect(yield* refusal(endpoint, { Authorization: `Bearer ${yield* token({ sub: "mallory" })}` })).toMatch(/^1008 extension .* not found or not connected$/)
        expect(yield* refusal(`${ws}/cdp/`, { Authorization: `Bearer ${yield* token({ sub: "alice" })}` })).toBe("HTTP 404")
      }), 120_000)
  })
})
