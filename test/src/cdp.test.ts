/**
 * A user's own browser as a CDP endpoint (`/cdp/{extension_id}`): the project's extension in real
 * headless Chromium connects to Switchboard as usual, and the unmodified CDP clients, pinned, drive
 * that browser through the endpoint. Playwright (`connectOverCDP`) and Puppeteer (`connect`) open
 * a page, navigate to a served page, evaluate, fill and click, hear a console event, take a
 * screenshot and close the page; Playwright MCP and Chrome DevTools MCP, started with the endpoint
 * on their command lines, navigate and snapshot it. Another user, and no token, get nothing. The
 * services run as processes on NATS, and every client connects through another edge than the
 * extension's.
 */
import { describe, expect, layer } from "@effect/vitest"
import { NatsServer } from "@switchboard/testing"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import { type Browser, chromium, type Worker } from "playwright-core"
import puppeteer from "puppeteer-core"
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"
import WebSocket from "ws"
import { configure, extensionAttached, extensionsUntil, pageServer, pngSize, tempDir, withExtension } from "./support/ExtensionHarness.ts"
import * as Processes from "./support/Processes.ts"
import { client } from "./support/ProxyPeers.ts"
import { expiredToken, token } from "./support/Stack.ts"

const require = createRequire(import.meta.url)

const pages = {
  "/control.html": `<!doctype html><title>Control</title>
<button id="go" onclick="document.getElementById('out').textContent = 'clicked ' + document.getElementById('name').value">Go</button>
<p id="out">idle</p>
<input id="name">`
}

interface Harness {
  readonly worker: Worker
  readonly pages: string
  /** The edge the extension connects to, and another one, which the CDP clients use. */
  readonly extensionEdge: string
  readonly clientEdge: string
}
class CdpBrowser extends Context.Tag("test/CdpBrowser")<CdpBrowser, Harness>() {}

/**
 * One browser for the file, with the extension, the pages it is driven to, and one Switchboard of
 * processes on NATS (auth, router, two edges): every client connects through another edge than
 * the extension's.
 */
const browser = Layer.scoped(
  CdpBrowser,
  Effect.gen(function*() {
    const { extensionId, worker } = yield* withExtension
    const { url } = yield* NatsServer
    const { edges: [a, b] } = yield* Processes.deployment(url, { edges: 2, env: { ALLOWED_ORIGINS: `chrome-extension://${extensionId}` } })
    if (a === undefined || b === undefined) return yield* Effect.dieMessage("the deployment has fewer than two edges")
    return { worker, pages: yield* pageServer(pages), extensionEdge: a.ws, clientEdge: b.ws }
  })
).pipe(Layer.provide(NatsServer.layer))

/** Points the extension at its edge as `user`; the CDP endpoint of that extension on the other edge. */
const connectedAs = (user: string) =>
  Effect.gen(function*() {
    const { clientEdge, extensionEdge, worker } = yield* CdpBrowser
    yield* configure(worker, extensionEdge, user)
    return `${clientEdge}/cdp/${yield* extensionIdAt(clientEdge, user)}`
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

/** The same steps with Puppeteer (`puppeteer-core`'s `connect`). */
const driveWithPuppeteer = (endpoint: string, user: string, pages: string) =>
  Effect.gen(function*() {
    const headers = { Authorization: `Bearer ${yield* token({ sub: user })}` }
    const remote = yield* Effect.acquireRelease(
      Effect.promise(() => puppeteer.connect({ browserWSEndpoint: endpoint, headers, defaultViewport: null, protocolTimeout: 30_000 })),
      (b) => Effect.promise(() => b.disconnect().catch(() => undefined))
    )
    const page = yield* Effect.promise(() => remote.newPage())
    yield* Effect.promise(() => page.goto(`${pages}/control.html`))
    expect(yield* Effect.promise(() => page.title())).toBe("Control")
    expect(yield* Effect.promise(() => page.evaluate(() => [1 + 1, location.pathname]))).toEqual([2, "/control.html"])

    yield* Effect.promise(() => page.type("#name", "by Puppeteer"))
    yield* Effect.promise(() => page.click("#go"))
    expect(yield* Effect.promise(() => page.$eval("#out", (e) => e.textContent))).toBe("clicked by Puppeteer")

    const logged = new Promise<string>((resolve) => page.once("console", (m) => resolve(m.text())))
    yield* Effect.promise(() => page.evaluate(() => console.log("hello to Puppeteer")))
    expect(yield* Effect.promise(() => logged)).toBe("hello to Puppeteer")

    // Without a viewport of Puppeteer's (`defaultViewport: null`), Chrome captures what the
    // window shows: the page's width, and a height the window decides.
    const width = yield* Effect.promise(() => page.evaluate(() => innerWidth))
    const shot = Buffer.from(yield* Effect.promise(() => page.screenshot()))
    expect(pngSize(shot)).toEqual({ width, height: expect.any(Number) })
    yield* Effect.promise(() => page.close())
  })

/** An MCP server that drives a browser over CDP, started as its users start it, with the SDK's client on its stdio. */
const mcpServer = (script: string, args: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    // In a directory of its own: Playwright MCP writes its snapshots under the working directory.
    const cwd = yield* tempDir("sb-cdp-mcp-")
    return yield* Effect.acquireRelease(
      Effect.promise(async () => {
        const mcp = new Client({ name: "cdp-test", version: "1.0.0" })
        await mcp.connect(new StdioClientTransport({ command: process.execPath, args: [script, ...args], stderr: "pipe", cwd }))
        return mcp
      }),
      (mcp) => Effect.promise(() => mcp.close().catch(() => undefined))
    )
  })

/** The text of a tool's answer; an error answer fails the test with it. */
const callTool = (mcp: Client, name: string, args: Record<string, unknown> = {}) =>
  Effect.promise(() => mcp.callTool({ name, arguments: args }, undefined, { timeout: 60_000 })).pipe(
    Effect.map((r) => {
      const text = (r.content as Array<{ type: string; text?: string }>).map((c) => c.text ?? "").join("\n")
      if (r.isError === true) throw new Error(`${name} failed: ${text}`)
      return text
    })
  )

/** A bare CDP client on a WebSocket: `send` answers with the response to its command. */
const rawClient = (endpoint: string, user: string) =>
  Effect.gen(function*() {
    const t = yield* token({ sub: user })
    const ws = yield* Effect.acquireRelease(
      Effect.async<WebSocket>((resume) => {
        const socket = new WebSocket(endpoint, { headers: { Authorization: `Bearer ${t}` } })
        socket.once("open", () => resume(Effect.succeed(socket)))
        socket.once("error", (e) => resume(Effect.die(e)))
      }),
      (socket) => Effect.sync(() => socket.close())
    )
    const answers = new Map<number, (m: Record<string, unknown>) => void>()
    ws.on("message", (data) => {
      const m = JSON.parse(String(data)) as Record<string, unknown>
      if (typeof m["id"] === "number") answers.get(m["id"])?.(m)
    })
    let next = 0
    /** A frame as written (`raw`), or a command; its response. */
    const send = (command: { readonly method: string; readonly params?: object; readonly sessionId?: string } | { readonly raw: string; readonly id: number }) =>
      Effect.async<Record<string, unknown>>((resume) => {
        const id = "raw" in command ? command.id : ++next
        answers.set(id, (m) => resume(Effect.succeed(m)))
        ws.send("raw" in command ? command.raw : JSON.stringify({ id, ...command }))
      }).pipe(Effect.timeoutFail({ duration: "30 seconds", onTimeout: () => new Error(`no answer to ${JSON.stringify(command)}`) }))
    return { send, close: Effect.sync(() => ws.close()) }
  })

interface TabsGlobals {
  readonly chrome: { readonly tabs: { query(filter: { readonly url: string }): Promise<Array<unknown>> } }
}

/** The proxy's id of the extension, once it has connected to `ws` as `user`. */
const extensionIdAt = (ws: string, user: string) =>
  Effect.gen(function*() {
    const mcp = yield* client(ws, user)
    const [ext] = yield* extensionsUntil(mcp, (l) => l.length === 1)
    return ext!.id
  })

layer(browser, { excludeTestServices: true, timeout: "180 seconds" })("CDP endpoint", (it) => {
  describe("CDP clients", () => {
    it.scoped("drives a new page of the user's browser: goto, evaluate, fill, click, console, screenshot, close", () =>
      Effect.gen(function*() {
        const { pages } = yield* CdpBrowser
        // Given the http:// URL, Playwright reads /json/version first and opens the WebSocket it names.
        yield* drive((yield* connectedAs("alice")).replace("ws://", "http://"), "alice", pages)
      }), 120_000)

    it.scoped("Puppeteer (connect) does the same", () =>
      Effect.gen(function*() {
        const { pages } = yield* CdpBrowser
        yield* driveWithPuppeteer(yield* connectedAs("dan"), "dan", pages)
      }), 120_000)

    it.scoped("Playwright MCP (--cdp-endpoint, --cdp-header) navigates and snapshots the served page", () =>
      Effect.gen(function*() {
        const { pages } = yield* CdpBrowser
        const endpoint = yield* connectedAs("erin")
        const mcp = yield* mcpServer(join(dirname(require.resolve("@playwright/mcp/package.json")), "cli.js"), ["--cdp-endpoint", endpoint, "--cdp-header", `Authorization: Bearer ${yield* token({ sub: "erin" })}`])
        yield* callTool(mcp, "browser_navigate", { url: `${pages}/control.html` })
        const snapshot = yield* callTool(mcp, "browser_snapshot")
        expect(snapshot).toContain("button \"Go\"")
        expect(snapshot).toContain("idle")
      }), 120_000)

    it.scoped("Chrome DevTools MCP (--wsEndpoint, --wsHeaders) lists its page and snapshots it", () =>
      Effect.gen(function*() {
        const { pages } = yield* CdpBrowser
        const endpoint = yield* connectedAs("faye")
        const headers = JSON.stringify({ Authorization: `Bearer ${yield* token({ sub: "faye" })}` })
        const mcp = yield* mcpServer(require.resolve("chrome-devtools-mcp/build/src/bin/chrome-devtools-mcp.js"), ["--wsEndpoint", endpoint, "--wsHeaders", headers])
        yield* callTool(mcp, "new_page", { url: `${pages}/control.html` })
        // Listed as "<pageId>: <url> [selected]"; page tools name the page by that id.
        const listed = yield* callTool(mcp, "list_pages")
        const pageId = new RegExp(`^(\\d+): ${pages}/control\\.html`, "m").exec(listed)?.[1]
        expect(pageId, listed).toBeDefined()
        const snapshot = yield* callTool(mcp, "take_snapshot", { pageId: Number(pageId) })
        expect(snapshot).toContain("button \"Go\"")
      }), 120_000)

    it.scoped("keeps each client to its own tabs, answers bad frames as Chrome does, and detaches a client's tabs when it goes", () =>
      Effect.gen(function*() {
        const { pages, worker } = yield* CdpBrowser
        const endpoint = yield* connectedAs("carol")
        const first = yield* rawClient(endpoint, "carol")
        const second = yield* rawClient(endpoint, "carol")
        const created = yield* first.send({ method: "Target.createTarget", params: { url: `${pages}/control.html` } })
        const targetId = (created["result"] as { targetId: string }).targetId
        expect(yield* extensionAttached(worker, { id: targetId })).toBe(true)

        // The other client sees none of it, and may not take it.
        expect(yield* second.send({ method: "Target.getTargets" })).toMatchObject({ result: { targetInfos: [] } })
        expect(yield* second.send({ method: "Target.attachToTarget", params: { targetId, flatten: true } })).toMatchObject({ error: { code: -32602, message: expect.stringMatching(/drives only the tabs it opened/) } })
        expect(yield* second.send({ method: "Runtime.evaluate", params: { expression: "1" }, sessionId: "sb-made-up" })).toMatchObject({ error: { message: "Session with given id not found." } })

        // A page the debugger may not attach to gets an error, not a hang.
        expect(yield* second.send({ method: "Target.createTarget", params: { url: "chrome://version" } })).toMatchObject({ error: { message: expect.stringMatching(/chrome:\/\//) } })
        // and the tab opened for it is closed again.
        yield* Effect.promise(() => worker.evaluate(async () => (await (globalThis as unknown as TabsGlobals).chrome.tabs.query({ url: "chrome://version/*" })).length)).pipe(
          Effect.filterOrFail((n) => n === 0, (n) => new Error(`${n} chrome://version tabs are still open`)),
          Effect.retry(Schedule.spaced("100 millis")),
          Effect.timeoutFail({ duration: "30 seconds", onTimeout: () => new Error("the tab of a page the debugger refused stayed open") })
        )

        // Bad frames get CDP's errors, and the socket goes on.
        expect(yield* second.send({ raw: "{not json", id: 0 })).toMatchObject({ error: { code: -32700 } })
        expect(yield* second.send({ raw: JSON.stringify({ id: 7, params: {} }), id: 7 })).toMatchObject({ error: { code: -32600 } })
        expect(yield* second.send({ method: "SystemInfo.getInfo" })).toMatchObject({ error: { code: -32601 } })
        expect(yield* second.send({ method: "Target.createBrowserContext" })).toMatchObject({ error: { message: expect.stringMatching(/one browser context/) } })

        // The first client's page works in its session, and its tab is let go when it leaves.
        const attached = yield* first.send({ method: "Target.attachToTarget", params: { targetId, flatten: true } })
        const sessionId = (attached["result"] as { sessionId: string }).sessionId
        expect(yield* first.send({ method: "Runtime.evaluate", params: { expression: "document.title", returnByValue: true }, sessionId })).toMatchObject({ result: { result: { value: "Control" } } })
        yield* first.close
        yield* extensionAttached(worker, { id: targetId }).pipe(
          Effect.filterOrFail((a) => a === false, () => new Error("the debugger is still attached")),
          Effect.retry(Schedule.spaced("100 millis")),
          Effect.timeoutFail({ duration: "30 seconds", onTimeout: () => new Error("the tab was not detached after its client left") })
        )
      }), 120_000)

    it.scoped("refuses an upgrade without a token (401) and another user's extension id; the discovery documents likewise", () =>
      Effect.gen(function*() {
        const { clientEdge } = yield* CdpBrowser
        const endpoint = yield* connectedAs("alice")
        expect(yield* refusal(endpoint)).toBe("HTTP 401")
        expect(yield* refusal(endpoint, { Authorization: "Bearer not-a-token" })).toBe("HTTP 401")
        expect(yield* refusal(endpoint, { Authorization: `Bearer ${expiredToken("alice")}` })).toBe("HTTP 401")
        expect(yield* refusal(endpoint, { Authorization: `Bearer ${yield* token({ sub: "mallory" })}` })).toMatch(/^1008 extension .* not found or not connected$/)
        expect(yield* refusal(`${clientEdge}/cdp/`, { Authorization: `Bearer ${yield* token({ sub: "alice" })}` })).toBe("HTTP 404")

        // The discovery documents: the same rules, over HTTP.
        const document = (path: string, headers: Record<string, string> = {}) =>
          Effect.promise(async () => {
            const res = await fetch(`${endpoint.replace("ws://", "http://")}${path}`, { headers })
            return { status: res.status, body: (await res.json()) as unknown }
          })
        const alice = { Authorization: `Bearer ${yield* token({ sub: "alice" })}` }
        expect(yield* document("/json/version", alice)).toEqual({ status: 200, body: expect.objectContaining({ "Protocol-Version": "1.3", webSocketDebuggerUrl: endpoint }) })
        expect(yield* document("/json/list", alice)).toEqual({ status: 200, body: [] })
        expect((yield* document("/json/version")).status).toBe(401)
        expect((yield* document("/json/version", { Authorization: `Bearer ${expiredToken("alice")}` })).status).toBe(401)
        expect((yield* document(`/json/version?token=${yield* token({ sub: "alice" })}`)).status).toBe(200)
        expect((yield* document("/json/version", { Authorization: `Bearer ${yield* token({ sub: "mallory" })}` })).status).toBe(404)
        expect((yield* document("/json/protocol", alice)).status).toBe(404)
      }), 120_000)
  })
})
