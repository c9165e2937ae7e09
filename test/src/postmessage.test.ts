/**
 * The postMessage transport (shared/specs/postmessage-transport.md) in real headless Chromium,
 * across real origins on loopback: an outer page and an inner page (iframe or popup) run the
 * setup phase, then the transport phase, with the MCP SDK's own `Client` and `McpServer` on either
 * side. The pages are clients/postmessage/test/pages/, loading the library's `<script>` bundle.
 */
import { describe, expect, layer } from "@effect/vitest"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as ExecutionStrategy from "effect/ExecutionStrategy"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import { Registry } from "@switchboard/registry"
import * as Schedule from "effect/Schedule"
import * as Scope from "effect/Scope"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { BrowserContext, Frame, Page } from "playwright-core"
import { buildEmbedScript } from "../../clients/postmessage/build.ts"
import { origins } from "../../clients/postmessage/test/PageServer.ts"
import { launch } from "./support/Browser.ts"
import { expiredToken, serve, token } from "./support/Stack.ts"
import { page as tabPage, tab } from "./support/Tabs.ts"
import { until } from "./support/Until.ts"

interface Harness {
  readonly browser: BrowserContext
  /** The outer pages' origin. */
  readonly a: string
  /** The inner pages' origin: another port of the same host (same-site, so storage works). */
  readonly b: string
  /** A third origin, cross-site. */
  readonly c: string
  /** The built script of the /embed page. */
  readonly embedScript: string
}
class PostMessagePages extends Context.Tag("test/PostMessagePages")<PostMessagePages, Harness>() {}

const harness = Layer.scoped(
  PostMessagePages,
  Effect.gen(function*() {
    const served = yield* origins
    // The page the edge serves at /embed, as the package build makes it.
    const dir = yield* Effect.acquireRelease(
      Effect.promise(() => mkdtemp(join(tmpdir(), "sb-embed-"))),
      (d) => Effect.promise(() => rm(d, { recursive: true, force: true }))
    )
    const embedScript = join(dir, "embed.js")
    yield* Effect.promise(() => buildEmbedScript(embedScript))
    // Popups here are opened from page.evaluate, which is no user gesture.
    const browser = yield* launch({ args: ["--disable-popup-blocking"] })
    return { browser, embedScript, ...served }
  })
)

interface Failure {
  readonly ok: false
  readonly reason: string | null
  readonly message: string
}
interface SetupResult {
  readonly status: "success" | "error"
  readonly serverTitle: string
  readonly ephemeralMessage?: string
  readonly transportVisibility: { readonly requirement: string; readonly optionalMessage?: string }
  readonly error?: { readonly code: string; readonly message: string }
}
type Kind = "iframe" | "popup"
interface Options {
  readonly kind: Kind
  readonly serverUrl: string
  readonly sessionId: string
  readonly allowedOrigins?: ReadonlyArray<string>
  readonly handshakeTimeoutMs?: number
  readonly setupTimeoutMs?: number
  readonly requirement?: string
  readonly userWantsVisible?: boolean
}
/** What outer.js puts on `window`. */
interface OuterWindow {
  setUp(options: Options): Promise<{ readonly ok: true; readonly result: SetupResult } | Failure>
  connect(options: Options): Promise<{ readonly ok: true; readonly tools: Array<string>; readonly hidden: boolean | null } | Failure>
  serve(options: Options): Promise<{ readonly ok: true } | Failure>
  rawHandshake(serverUrl: string, claimedOrigin: string): Promise<Array<unknown>>
  echo(text: string): Promise<string>
  call(name: string, args: Readonly<Record<string, unknown>>): Promise<string>
  request(method: string, params: Readonly<Record<string, unknown>>, timeout: number): Promise<{ readonly ok: true; readonly result: unknown } | Failure>
  readonly log: Array<unknown>
  readonly errors: Array<string>
  readonly frame: { readonly element: HTMLIFrameElement | null }
}

/** The outer page, as the test drives it. */
const outerPage = (url: string) =>
  Effect.gen(function*() {
    const { browser } = yield* PostMessagePages
    const popups: Array<Page> = []
    const page = yield* Effect.acquireRelease(
      Effect.promise(() => browser.newPage()),
      (p) => Effect.promise(() => Promise.all([p, ...popups].map((q) => q.close())))
    )
    page.on("popup", (popup) => popups.push(popup))
    yield* Effect.promise(() => page.goto(`${url}/outer.html`))
    return {
      page,
      setUp: (options: Options) => Effect.promise(() => page.evaluate((o) => (window as unknown as OuterWindow).setUp(o), options)),
      connect: (options: Options) => Effect.promise(() => page.evaluate((o) => (window as unknown as OuterWindow).connect(o), options)),
      serve: (options: Options) => Effect.promise(() => page.evaluate((o) => (window as unknown as OuterWindow).serve(o), options)),
      rawHandshake: (serverUrl: string, claimedOrigin: string) =>
        Effect.promise(() => page.evaluate(([url, claimed]) => (window as unknown as OuterWindow).rawHandshake(url, claimed), [serverUrl, claimedOrigin] as const)),
      call: (name: string, args: Readonly<Record<string, unknown>>) =>
        Effect.promise(() => page.evaluate(([n, a]) => (window as unknown as OuterWindow).call(n, a), [name, args] as const)),
      request: (method: string, params: Readonly<Record<string, unknown>>, timeout: number) =>
        Effect.promise(() => page.evaluate(([m, p, t]) => (window as unknown as OuterWindow).request(m, p, t), [method, params, timeout] as const)),
      echo: (text: string) => Effect.promise(() => page.evaluate((t) => (window as unknown as OuterWindow).echo(t), text)),
      log: Effect.promise(() => page.evaluate(() => (window as unknown as OuterWindow).log)),
      iframes: Effect.promise(() => page.evaluate(() => document.querySelectorAll("iframe").length)),
      hidden: Effect.promise(() => page.evaluate(() => (window as unknown as OuterWindow).frame.element?.hidden ?? null))
    }
  })

let sessions = 0
const sessionId = () => `session-${process.pid}-${++sessions}`

let pages = 0
/** A URL of `path` no other test uses, so that a test finds its own frames. */
const unique = (origin: string, path: string, query: string) => `${origin}/${path}?${query}&page=${++pages}`
const innerServer = (origin: string, query: string) => unique(origin, "inner-server.html", query)

/** The frame (in any page of the browser) at `url`, once it has navigated there. */
const frameAt = (browser: BrowserContext, url: string) =>
  Effect.suspend(() => {
    const frame = browser.pages().flatMap((p) => p.frames()).find((f) => f.url() === url && !f.isDetached())
    return frame === undefined ? Effect.fail(`no frame at ${url}`) : Effect.succeed(frame)
  }).pipe(
    Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 250 }),
    Effect.orDieWith((what) => new Error(what))
  )

const evaluate = <A>(frame: Frame | Page, expression: string) => Effect.promise(() => frame.evaluate(expression) as Promise<A>)

/** Once `expression` holds in `frame`. */
const waitFor = (frame: Frame | Page, expression: string) => Effect.promise(() => frame.waitForFunction(expression))

/** A silent setup, then the transport phase in an iframe: the usual start of an attack. */
const connected = (origin: string, serverUrl: string, kind: Kind = "iframe") =>
  Effect.gen(function*() {
    const outer = yield* outerPage(origin)
    const id = sessionId()
    expect(yield* outer.setUp({ kind, serverUrl, sessionId: id })).toMatchObject({ ok: true, result: { status: "success" } })
    expect(yield* outer.connect({ kind, serverUrl, sessionId: id })).toMatchObject({ ok: true, tools: ["echo"] })
    return { outer, id }
  })

/** What inner-client.js concluded, once its script has run. */
const outcome = (frame: Frame) =>
  Effect.promise(() => frame.waitForFunction(() => "done" in window)).pipe(Effect.zipRight(evaluate(frame, "done")))

layer(harness, { excludeTestServices: true, timeout: "60 seconds" })("postMessage transport in Chromium", (it) => {
  describe("standard architecture: the outer page is the MCP client", () => {
    it.scoped("an SDK Client lists and calls the tool of an SDK McpServer in a cross-origin iframe, after a silent setup", () =>
      Effect.gen(function*() {
        const { a, b } = yield* PostMessagePages
        const outer = yield* outerPage(a)
        const serverUrl = innerServer(b, `allow=${a}`)
        const id = sessionId()

        const setup = yield* outer.setUp({ kind: "iframe", serverUrl, sessionId: id })
        expect(setup).toEqual({
          ok: true,
          result: { type: "MCP_SETUP_COMPLETE", status: "success", serverTitle: "Echo (automatic)", displayName: "Echo (automatic)", ephemeralMessage: "Saved", transportVisibility: { requirement: "hidden" } }
        })
        expect(yield* outer.log).toEqual([{ setupVisible: false }])
        expect(yield* outer.iframes).toBe(0) // the setup frame is gone; transport loads a new one

        const connected = yield* outer.connect({ kind: "iframe", serverUrl, sessionId: id, requirement: "hidden" })
        expect(connected).toEqual({ ok: true, tools: ["echo"], hidden: true })
        // The transport phase runs on the base URL: no #setup.
        expect(outer.page.frames().map((f) => f.url())).toContain(serverUrl)
        expect(yield* outer.echo("hello")).toBe(`hello | token automatic | from ${a} | session ${id}`)
        const inner = yield* frameAt(outer.page.context(), serverUrl)
        expect(yield* evaluate(inner, "server.server.getClientVersion()")).toEqual({ name: "outer", version: "1.0.0" })
        // The default sandbox: the server's frame may not navigate the page that embeds it.
        yield* evaluate(inner, `try { top.location.href = "${b}/blank.html" } catch {}`)
        expect(yield* outer.echo("still embedded")).toContain("still embedded")
        expect(outer.page.url()).toBe(`${a}/outer.html`)
      }))

    it.scoped("the same through a popup opened with window.open", () =>
      Effect.gen(function*() {
        const { a, b, browser } = yield* PostMessagePages
        const outer = yield* outerPage(a)
        const serverUrl = innerServer(b, `allow=${a}`)
        const id = sessionId()

        const setup = yield* outer.setUp({ kind: "popup", serverUrl, sessionId: id })
        expect(setup).toMatchObject({ ok: true, result: { status: "success", serverTitle: "Echo (automatic)" } })
        yield* until(() => !browser.pages().some((p) => p.url() === `${serverUrl}#setup`), "the setup popup closes")

        expect(yield* outer.connect({ kind: "popup", serverUrl, sessionId: id })).toEqual({ ok: true, tools: ["echo"], hidden: null })
        expect(browser.pages().map((p) => p.url())).toContain(serverUrl)
        expect(yield* outer.echo("from a popup")).toBe(`from a popup | token automatic | from ${a} | session ${id}`)

        // The user closes the popup: the SDK client hears the transport close, and why.
        const popup = yield* frameAt(browser, serverUrl)
        yield* Effect.promise(() => popup.page().close())
        yield* waitFor(outer.page, "window.clientClosed === true")
        expect(yield* evaluate(outer.page, "errors")).toEqual(["NoPeerWindow"])
      }))

    it.scoped("a visible setup shows the frame and who is asking; a cancel is an error; what it stores is scoped to the session id", () =>
      Effect.gen(function*() {
        const { a, b } = yield* PostMessagePages
        const outer = yield* outerPage(a)
        const serverUrl = innerServer(b, `allow=${a}&visibleSetup=1&visibility=optional`)
        const form = outer.page.frameLocator("iframe[title=server]")

        // Playwright only clicks what is visible: the outer frame showed the iframe when asked to.
        const cancelled = Effect.promise(() => outer.page.evaluate((o) => (window as unknown as OuterWindow).setUp(o), { kind: "iframe" as const, serverUrl, sessionId: sessionId() }))
        const clickCancel = Effect.promise(() => form.locator("#cancel").click())
        const [result] = yield* Effect.all([cancelled, clickCancel], { concurrency: 2 })
        expect(result).toMatchObject({ ok: true, result: { status: "error", error: { code: "USER_CANCELLED", message: "the user cancelled" } } })

        const id = sessionId()
        const saved = Effect.promise(() => outer.page.evaluate((o) => (window as unknown as OuterWindow).setUp(o), { kind: "iframe" as const, serverUrl, sessionId: id }))
        const fill = Effect.gen(function*() {
          expect(yield* Effect.promise(() => form.locator("#asking").textContent())).toBe(a)
          yield* Effect.promise(() => form.locator("#token").fill("s3cret"))
          yield* Effect.promise(() => form.locator("#save").click())
        })
        const [setup] = yield* Effect.all([saved, fill], { concurrency: 2 })
        expect(setup).toEqual({
          ok: true,
          result: {
            type: "MCP_SETUP_COMPLETE",
            status: "success",
            serverTitle: "Echo (s3cret)",
            displayName: "Echo (s3cret)",
            ephemeralMessage: "Saved",
            transportVisibility: { requirement: "optional", optionalMessage: "Show the echo log" }
          }
        })
        expect(yield* outer.log).toEqual([{ setupVisible: true }, { setupVisible: true }])

        // Optional visibility, and this user chose to see it.
        const connected = yield* outer.connect({ kind: "iframe", serverUrl, sessionId: id, requirement: "optional", userWantsVisible: true })
        expect(connected).toEqual({ ok: true, tools: ["echo"], hidden: false })
        expect(yield* outer.echo("x")).toBe(`x | token s3cret | from ${a} | session ${id}`)

        // Another session id has no token: the server says MCP_SETUP_REQUIRED instead of accepting.
        const other = yield* outer.connect({ kind: "iframe", serverUrl, sessionId: sessionId() })
        expect(other).toEqual({ ok: false, reason: "SetupRequired", message: "setup required (AUTH_EXPIRED): no token for this session" })
        expect((yield* outer.log).at(-1)).toEqual({ type: "MCP_SETUP_REQUIRED", reason: "AUTH_EXPIRED", message: "no token for this session", canContinue: false })
      }))

    it.scoped("a server that must be visible is shown; MCP_SETUP_REQUIRED during the session reaches the outer frame and the session goes on", () =>
      Effect.gen(function*() {
        const { a, b, browser } = yield* PostMessagePages
        const outer = yield* outerPage(a)
        const serverUrl = innerServer(b, `allow=${a}&visibility=required`)
        const id = sessionId()
        const setup = yield* outer.setUp({ kind: "iframe", serverUrl, sessionId: id })
        expect(setup).toMatchObject({ ok: true, result: { transportVisibility: { requirement: "required" } } })

        // Required wins over the user's wish to hide it.
        expect(yield* outer.connect({ kind: "iframe", serverUrl, sessionId: id, requirement: "required", userWantsVisible: false })).toEqual({ ok: true, tools: ["echo"], hidden: false })
        const inner = yield* frameAt(browser, serverUrl)
        yield* evaluate(inner, `transport.requireSetup({ reason: "CONFIG_CHANGED", message: "new scopes", canContinue: true })`)
        expect(yield* outer.echo("still here")).toBe(`still here | token automatic | from ${a} | session ${id}`)
        expect(yield* outer.log).toContainEqual({ type: "MCP_SETUP_REQUIRED", reason: "CONFIG_CHANGED", message: "new scopes", canContinue: true })
      }))
  })

  describe("inverted architecture: the outer page is the MCP server", () => {
    it.scoped("an SDK Client in a cross-origin iframe lists and calls the tool of the outer page's McpServer", () =>
      Effect.gen(function*() {
        const { a, b, browser } = yield* PostMessagePages
        const outer = yield* outerPage(a)
        const serverUrl = unique(b, "inner-client.html", `allow=${a}`)
        const id = sessionId()

        expect(yield* outer.setUp({ kind: "iframe", serverUrl, sessionId: id })).toMatchObject({
          ok: true,
          result: { status: "success", serverTitle: "Copilot", transportVisibility: { requirement: "required" } }
        })
        expect(yield* outer.serve({ kind: "iframe", serverUrl, sessionId: id, requirement: "required" })).toEqual({ ok: true })
        expect(yield* outer.hidden).toBe(false)

        const inner = yield* frameAt(browser, serverUrl)
        expect(yield* outcome(inner)).toEqual({
          ok: true,
          tools: ["lookupUser"],
          text: `user 42 is Ada, asked over session ${id}`,
          session: { sessionId: id, origin: a }
        })
        // The SDK client in the frame really initialized (the server knows its name).
        expect(yield* evaluate(outer.page, "server.server.getClientVersion()")).toEqual({ name: "copilot", version: "1.0.0" })
      }))
  })

  describe("timeouts", () => {
    it.scoped("each handshake step times out, and the error reaches the SDK's connect on either side", () =>
      Effect.gen(function*() {
        const { a, b, browser } = yield* PostMessagePages
        const outer = yield* outerPage(a)

        // The outer frame: a page that never speaks the protocol.
        expect(yield* outer.connect({ kind: "iframe", serverUrl: `${b}/blank.html`, sessionId: sessionId(), handshakeTimeoutMs: 500 })).toEqual({
          ok: false,
          reason: "HandshakeTimeout",
          message: `no MCP_TRANSPORT_HANDSHAKE from ${b}/blank.html within 500 ms`
        })
        expect(yield* outer.setUp({ kind: "iframe", serverUrl: `${b}/blank.html`, sessionId: sessionId(), handshakeTimeoutMs: 500 })).toEqual({
          ok: false,
          reason: "HandshakeTimeout",
          message: `no MCP_SETUP_HANDSHAKE from ${b}/blank.html#setup within 500 ms`
        })
        // A visible setup nobody finishes.
        const slow = innerServer(b, `allow=${a}&visibleSetup=1`)
        expect(yield* outer.setUp({ kind: "iframe", serverUrl: slow, sessionId: sessionId(), setupTimeoutMs: 500 })).toEqual({
          ok: false,
          reason: "SetupTimeout",
          message: `no MCP_SETUP_COMPLETE from ${slow}#setup within 500 ms`
        })

        // The inner frame: embedded by a page that never answers its handshake.
        const lonely = unique(b, "inner-client.html", `allow=${a}&timeout=500`)
        yield* evaluate(outer.page, `document.body.insertAdjacentHTML("beforeend", '<iframe src="${lonely}"></iframe>')`)
        const inner = yield* frameAt(browser, lonely)
        expect(yield* outcome(inner)).toEqual({
          ok: false,
          reason: "HandshakeTimeout",
          message: "no MCP_TRANSPORT_HANDSHAKE_REPLY within 500 ms"
        })
      }))
  })

  describe("hostile peers", () => {
    it.scoped("an outer origin not in the inner frame's allow-list gets a clear refusal in both phases, and no tools", () =>
      Effect.gen(function*() {
        const { a, b, c } = yield* PostMessagePages
        const outer = yield* outerPage(c)
        const serverUrl = innerServer(b, `allow=${a}`)
        expect(yield* outer.setUp({ kind: "iframe", serverUrl, sessionId: sessionId() })).toEqual({
          ok: true,
          result: {
            type: "MCP_SETUP_COMPLETE",
            status: "error",
            serverTitle: "",
            transportVisibility: { requirement: "hidden" },
            error: { code: "CONFIG_ERROR", message: `${c} is not allowed to use this server` }
          }
        })
        expect(yield* outer.connect({ kind: "iframe", serverUrl, sessionId: sessionId() })).toEqual({
          ok: false,
          reason: "SetupRequired",
          message: `setup required (PERMISSIONS_CHANGED): ${c} is not allowed to use this server`
        })
      }))

    it.scoped("the outer frame's allow-list: an inner frame answering from an origin not on it is never answered", () =>
      Effect.gen(function*() {
        const { a, b, c } = yield* PostMessagePages
        const outer = yield* outerPage(a)
        const serverUrl = innerServer(b, `allow=${a}`)
        expect(yield* outer.connect({ kind: "iframe", serverUrl, sessionId: sessionId(), allowedOrigins: [c], handshakeTimeoutMs: 800 })).toEqual({
          ok: false,
          reason: "HandshakeTimeout",
          message: `no MCP_TRANSPORT_HANDSHAKE from ${serverUrl} within 800 ms`
        })
      }))

    it.scoped("an origin written inside the messages is ignored: only event.origin counts", () =>
      Effect.gen(function*() {
        const { a, b, browser, c } = yield* PostMessagePages
        const outer = yield* outerPage(c)
        const serverUrl = innerServer(b, `allow=${a}`)
        const received = outer.rawHandshake(serverUrl, a)
        const mark = Effect.gen(function*() {
          const inner = yield* frameAt(browser, serverUrl)
          yield* waitFor(inner, `window.events?.includes("OriginNotAllowed")`)
          // Anything the inner frame answered to the claimed origin's MCP_MESSAGE would come before this.
          yield* evaluate(inner, `parent.postMessage("marker", "*")`)
          return inner
        })
        const [messages, inner] = yield* Effect.all([received, mark], { concurrency: 2 })
        expect(messages).toEqual([
          { type: "MCP_TRANSPORT_HANDSHAKE", protocolVersion: "1.0" },
          { type: "MCP_SETUP_REQUIRED", reason: "PERMISSIONS_CHANGED", message: `${c} is not allowed to use this server`, canContinue: false },
          "marker"
        ])
        // Refused twice over: reported to onerror, and the rejected handshake. Nothing pinned, no server.
        expect(yield* evaluate(inner, "[window.events, transport.session ?? null, typeof window.server]")).toEqual([
          ["OriginNotAllowed", "OriginNotAllowed"],
          null,
          "undefined"
        ])
      }))

    it.scoped("messages forged by a frame of another origin, or by another window, reach neither side", () =>
      Effect.gen(function*() {
        const { a, b, browser, c } = yield* PostMessagePages
        const serverUrl = innerServer(b, `allow=${a}`)
        const { id, outer } = yield* connected(a, serverUrl)
        yield* evaluate(outer.page, `document.body.insertAdjacentHTML("beforeend", '<iframe src="${c}/listener.html?frame"></iframe>');
          window.open("${c}/listener.html?popup")`)
        const forge = (from: Frame, outerWindow: string) =>
          waitFor(from, `"got" in window`).pipe(Effect.zipRight(evaluate(from, `{
            const outer = ${outerWindow}, inner = outer.frames[0]
            outer.postMessage({ type: "MCP_MESSAGE", payload: { jsonrpc: "2.0", method: "notifications/tools/list_changed" } }, "*")
            for (const id of [0, 1, 2, 3, 4, 5]) {
              outer.postMessage({ type: "MCP_MESSAGE", payload: { jsonrpc: "2.0", id, result: { content: [{ type: "text", text: "forged" }] } } }, "*")
            }
            outer.postMessage({ type: "MCP_TRANSPORT_HANDSHAKE", protocolVersion: "1.0" }, "*")
            inner.postMessage({ type: "MCP_TRANSPORT_HANDSHAKE_REPLY", protocolVersion: "1.0", sessionId: "forged" }, "*")
            inner.postMessage({ type: "MCP_MESSAGE", payload: { jsonrpc: "2.0", id: "forged-1", method: "tools/call", params: { name: "echo", arguments: { text: "forged" } } } }, "*")
          }`)))
        yield* forge(yield* frameAt(browser, `${c}/listener.html?frame`), "parent")
        yield* forge(yield* frameAt(browser, `${c}/listener.html?popup`), "opener")

        // Sent after the forgeries, so it is answered after they were handled.
        expect(yield* outer.echo("real")).toBe(`real | token automatic | from ${a} | session ${id}`)
        const delivered = yield* evaluate<Array<{ method?: string }>>(outer.page, "delivered")
        expect(delivered.filter((m) => JSON.stringify(m).includes("forged") || m.method === "notifications/tools/list_changed")).toEqual([])
        expect(yield* evaluate(outer.page, "errors")).toEqual([])
        const inner = yield* frameAt(browser, serverUrl)
        expect(yield* evaluate(inner, "[calls, events, transport.session.sessionId]")).toEqual([["real"], [], id])
      }))

    it.scoped("a replayed or second handshake on a pinned transport is refused on both sides", () =>
      Effect.gen(function*() {
        const { a, b, browser } = yield* PostMessagePages
        const serverUrl = innerServer(b, `allow=${a}`)
        const { id, outer } = yield* connected(a, serverUrl)
        const inner = yield* frameAt(browser, serverUrl)

        // The outer frame replays its reply, then sends another with a new session id.
        yield* evaluate(outer.page, `for (const sessionId of ["${id}", "second"]) {
          frame.window.postMessage({ type: "MCP_TRANSPORT_HANDSHAKE_REPLY", protocolVersion: "1.0", sessionId }, "${b}")
        }`)
        // The inner frame announces itself again.
        yield* evaluate(inner, `parent.postMessage({ type: "MCP_TRANSPORT_HANDSHAKE", protocolVersion: "1.0" }, "${a}")`)
        expect(yield* outer.echo("after")).toBe(`after | token automatic | from ${a} | session ${id}`)
        // A reply to the second handshake, had there been one, would arrive before this call.
        yield* outer.echo("again")

        expect(yield* evaluate(inner, "[events, replies, transport.session.sessionId]")).toEqual([["SecondHandshake", "SecondHandshake"], [id, id, "second"], id])
        expect(yield* evaluate(outer.page, "[errors, accepted]")).toEqual([["SecondHandshake"], [id]])
      }))

    it.scoped("nothing goes to '*' after pinning: a page of another origin that replaces the opener hears none of the popup's messages", () =>
      Effect.gen(function*() {
        const { a, b, browser, c } = yield* PostMessagePages
        const serverUrl = innerServer(b, `allow=${a}`)
        const { outer } = yield* connected(a, serverUrl, "popup")
        const popup = yield* frameAt(browser, serverUrl)

        yield* evaluate(outer.page, `setTimeout(() => { location.href = "${c}/listener.html" })`)
        yield* Effect.promise(() => outer.page.waitForURL(`${c}/listener.html`))
        yield* waitFor(outer.page, `"got" in window`)
        yield* evaluate(popup, `(async () => {
          await server.server.sendToolListChanged()
          await transport.requireSetup({ reason: "OTHER", message: "anyone there?", canContinue: true })
          opener.postMessage("control", "*")
        })()`)
        yield* waitFor(outer.page, `got.includes("control")`)
        expect(yield* evaluate(outer.page, "got")).toEqual(["control"])
      }))
  })

  describe("Switchboard's /embed", () => {
    /** A Switchboard with the registry, whose /embed the origins may embed. */
    const switchboard = (embedOrigins: string) =>
      Effect.flatMap(PostMessagePages, ({ embedScript }) =>
        serve(Registry.layer, { EMBED_ALLOWED_ORIGINS: embedOrigins, EMBED_SCRIPT: embedScript })
      )

    it.scoped("is a static page with its own script, a CSP that names who may frame it, and no secret", () =>
      Effect.gen(function*() {
        const { a } = yield* PostMessagePages
        const { url } = yield* switchboard(a)
        const html = yield* Effect.promise(() => fetch(`${url}/embed`))
        expect(html.status).toBe(200)
        expect(html.headers.get("content-type")).toBe("text/html; charset=utf-8")
        const policy = html.headers.get("content-security-policy")
        expect(policy).toContain("script-src 'self'")
        expect(policy).toContain(`frame-ancestors ${a}`)
        const body = yield* Effect.promise(() => html.text())
        expect(body).not.toContain("<script>") // no inline script
        expect(body).toContain('<script src="/embed/embed.js"></script>')
        const script = yield* Effect.promise(() => fetch(`${url}/embed/embed.js`))
        expect([script.status, script.headers.get("content-type")]).toEqual([200, "text/javascript; charset=utf-8"])

        // Embedding is opt-in: with no origins, nobody may frame it.
        const closed = yield* serve(Registry.layer, {})
        const none = yield* Effect.promise(() => fetch(`${closed.url}/embed`))
        expect(none.headers.get("content-security-policy")).toContain("frame-ancestors 'none'")
      }))

    it.scoped("an allowed app sets it up with a token, and after a reload lists and calls a tab's tool with no user action", () =>
      Effect.gen(function*() {
        const { a } = yield* PostMessagePages
        const { url, ws } = yield* switchboard(a)
        yield* tab(ws, tabPage("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/cart" })
        const alice = yield* token({ sub: "alice" })
        const outer = yield* outerPage(a)
        const serverUrl = `${url}/embed`
        const id = sessionId()

        const form = outer.page.frameLocator("iframe[title=server]")
        const setUp = Effect.promise(() => outer.page.evaluate((o) => (window as unknown as OuterWindow).setUp(o), { kind: "iframe" as const, serverUrl, sessionId: id }))
        const user = Effect.gen(function*() {
          // The form shows once the handshake has said who is asking.
          yield* Effect.promise(() => form.locator("#asking").waitFor({ state: "visible" }))
          expect(yield* Effect.promise(() => form.locator("#asking").textContent())).toBe(a)
          yield* Effect.promise(() => form.locator("#token").fill(alice))
          yield* Effect.promise(() => form.locator("#allow").click())
        })
        const [setup] = yield* Effect.all([setUp, user], { concurrency: 2 })
        expect(setup).toEqual({
          ok: true,
          result: {
            type: "MCP_SETUP_COMPLETE",
            status: "success",
            serverTitle: "Switchboard",
            displayName: "Switchboard",
            ephemeralMessage: "Switchboard connected",
            transportVisibility: { requirement: "hidden" }
          }
        })

        yield* Effect.promise(() => outer.page.reload())
        const connected = yield* outer.connect({ kind: "iframe", serverUrl, sessionId: id })
        expect(connected).toEqual({ ok: true, tools: ["website_tool_shop_example_com_tab1_getCart"], hidden: true })
        expect(yield* outer.call("website_tool_shop_example_com_tab1_getCart", { text: "via embed" })).toBe("shop:getCart:via embed")

        // A session that was never set up is told to run setup, not served.
        expect(yield* outer.connect({ kind: "iframe", serverUrl, sessionId: sessionId() })).toEqual({
          ok: false,
          reason: "SetupRequired",
          message: "setup required (OTHER): Switchboard is not set up for this session"
        })
      }))

    /** Sets `/embed` up for `sessionId` in the outer page, the user giving `userToken` in its form. */
    const setUpWithForm = (outer: Effect.Effect.Success<ReturnType<typeof outerPage>>, serverUrl: string, id: string, userToken: string) =>
      Effect.all([
        Effect.promise(() => outer.page.evaluate((o) => (window as unknown as OuterWindow).setUp(o), { kind: "iframe" as const, serverUrl, sessionId: id })),
        Effect.promise(async () => {
          const form = outer.page.frameLocator("iframe[title=server]")
          await form.locator("#token").fill(userToken)
          await form.locator("#allow").click()
        })
      ], { concurrency: 2 }).pipe(Effect.map(([setup]) => setup))

    it.scoped("once the stored token has expired, a connection is refused with MCP_SETUP_REQUIRED (AUTH_EXPIRED)", () =>
      Effect.gen(function*() {
        const { a, browser } = yield* PostMessagePages
        const { url } = yield* switchboard(a)
        const outer = yield* outerPage(a)
        const serverUrl = `${url}/embed`
        const id = sessionId()
        // Setup checks the token with the hub, so it must be good then: a short-lived one can run out
        // before a loaded machine has loaded the form, and setup then (rightly) waits for another.
        expect(yield* setUpWithForm(outer, serverUrl, id, yield* token({ sub: "carol" }))).toMatchObject({ ok: true, result: { status: "success" } })
        expect(yield* outer.connect({ kind: "iframe", serverUrl, sessionId: id })).toMatchObject({ ok: true })

        // Time passes: what setup stored (docs/protocols/postmessage.md names the key) has expired.
        const own = yield* Effect.acquireRelease(Effect.promise(() => browser.newPage()), (p) => Effect.promise(() => p.close()))
        yield* Effect.promise(() => own.goto(`${url}/embed/embed.js`))
        yield* Effect.promise(() => own.evaluate(([key, value]) => localStorage.setItem(key, value), [`switchboard-embed-token ${a} ${id}`, expiredToken("carol")] as const))

        expect(yield* outer.connect({ kind: "iframe", serverUrl, sessionId: id })).toEqual({
          ok: false,
          reason: "SetupRequired",
          message: "setup required (AUTH_EXPIRED): Switchboard refused the stored token: Authentication failed: token expired"
        })
      }))

    it.scoped("when the hub ends the session with 1008 while a request is in flight, the request fails at once and the app is told to run setup (AUTH_EXPIRED)", () =>
      Effect.gen(function*() {
        const { a } = yield* PostMessagePages
        const { url } = yield* switchboard(a)
        const outer = yield* outerPage(a)
        const serverUrl = `${url}/embed`
        const id = sessionId()
        expect(yield* setUpWithForm(outer, serverUrl, id, yield* token({ sub: "dave" }))).toMatchObject({ ok: true, result: { status: "success" } })
        expect(yield* outer.connect({ kind: "iframe", serverUrl, sessionId: id })).toEqual({ ok: true, tools: [], hidden: true })

        // The hub takes an expired token as it does at any time: it closes the session with 1008,
        // and never answers the request that carried it.
        const started = Date.now()
        const answer = yield* outer.request("authenticate", { token: expiredToken("dave") }, 20_000)
        expect(answer).toEqual({
          ok: false,
          reason: null,
          message: "MCP error -32000: Switchboard's hub closed this session: Authentication failed: token expired (1008)"
        })
        expect(Date.now() - started).toBeLessThan(10_000)
        // The app learns why, and the session is over: its transport closed, and the next request fails at once.
        expect(yield* outer.log).toContainEqual({
          type: "MCP_SETUP_REQUIRED",
          reason: "AUTH_EXPIRED",
          message: "Authentication failed: token expired",
          canContinue: false
        })
        yield* waitFor(outer.page, "window.clientClosed === true")
        expect(yield* outer.request("tools/list", {}, 20_000)).toEqual({ ok: false, reason: null, message: "Not connected" })
      }))

    it.scoped("when the hub goes away (this Switchboard stops), each request of the app is answered at once with why, and no setup is asked for", () =>
      Effect.gen(function*() {
        const { a } = yield* PostMessagePages
        const running = yield* Scope.fork(yield* Effect.scope, ExecutionStrategy.sequential)
        const { url } = yield* Scope.extend(switchboard(a), running)
        const outer = yield* outerPage(a)
        const serverUrl = `${url}/embed`
        const id = sessionId()
        expect(yield* setUpWithForm(outer, serverUrl, id, yield* token({ sub: "erin" }))).toMatchObject({ ok: true, result: { status: "success" } })
        expect(yield* outer.connect({ kind: "iframe", serverUrl, sessionId: id })).toEqual({ ok: true, tools: [], hidden: true })

        yield* Scope.close(running, Exit.void)
        const started = Date.now()
        const closed = { ok: false, reason: null, message: expect.stringContaining("MCP error -32000: Switchboard's hub closed this session: ") }
        expect(yield* outer.request("tools/list", {}, 20_000)).toEqual(closed)
        expect(yield* outer.request("ping", {}, 20_000)).toEqual(closed)
        expect(Date.now() - started).toBeLessThan(10_000)
        expect((yield* outer.log).filter((m) => typeof m === "object" && m !== null && "type" in m && m.type === "MCP_SETUP_REQUIRED")).toEqual([])
      }))

    it.scoped("an app of an origin not allowed gets no tools: the browser refuses to frame it, and a popup is refused by the page", () =>
      Effect.gen(function*() {
        const { a, c } = yield* PostMessagePages
        const { url } = yield* switchboard(a)
        const outer = yield* outerPage(c)
        const serverUrl = `${url}/embed`
        expect(yield* outer.connect({ kind: "iframe", serverUrl, sessionId: sessionId(), handshakeTimeoutMs: 1000 })).toEqual({
          ok: false,
          reason: "HandshakeTimeout",
          message: `no MCP_TRANSPORT_HANDSHAKE from ${serverUrl} within 1000 ms`
        })
        expect(yield* outer.connect({ kind: "popup", serverUrl, sessionId: sessionId() })).toEqual({
          ok: false,
          reason: "SetupRequired",
          message: `setup required (PERMISSIONS_CHANGED): ${c} is not allowed to use this server`
        })
        expect(yield* outer.setUp({ kind: "popup", serverUrl, sessionId: sessionId() })).toMatchObject({
          ok: true,
          result: { status: "error", error: { code: "CONFIG_ERROR", message: `${c} is not allowed to use this server` } }
        })
      }))

    it.scoped("embedded by another site, where this Chromium blocks the frame's storage: setup says so, and a popup works instead", () =>
      Effect.gen(function*() {
        const { browser, c } = yield* PostMessagePages
        const { url, ws } = yield* switchboard(c)
        yield* tab(ws, tabPage("shop", ["getCart"]), { user: "bob", tabId: 2, url: "https://shop.example.com/" })
        const bob = yield* token({ sub: "bob" })
        const outer = yield* outerPage(c)
        // Each attempt its own URL (the page ignores the query), so the test finds that attempt's frame.
        const attempt = (kind: Kind) => `${url}/embed?${kind}`

        /** Runs setup in `kind`, the user giving the token. */
        const setUpWithToken = (kind: Kind, id: string) =>
          Effect.all([
            Effect.promise(() => outer.page.evaluate((o) => (window as unknown as OuterWindow).setUp(o), { kind, serverUrl: attempt(kind), sessionId: id })),
            Effect.gen(function*() {
              const form = yield* frameAt(browser, `${attempt(kind)}#setup`)
              yield* Effect.promise(() => form.locator("#token").fill(bob))
              yield* Effect.promise(() => form.locator("#allow").click())
            })
          ], { concurrency: 2 }).pipe(Effect.map(([setup]) => setup))

        expect(yield* setUpWithToken("iframe", sessionId())).toMatchObject({
          ok: true,
          result: { status: "error", error: { code: "CONFIG_ERROR", message: expect.stringContaining("third-party storage is blocked") } }
        })

        const id = sessionId()
        expect(yield* setUpWithToken("popup", id)).toMatchObject({ ok: true, result: { status: "success", serverTitle: "Switchboard" } })
        expect(yield* outer.connect({ kind: "popup", serverUrl: attempt("popup"), sessionId: id })).toMatchObject({ ok: true, tools: ["website_tool_shop_example_com_tab2_getCart"] })
        expect(yield* outer.call("website_tool_shop_example_com_tab2_getCart", { text: "popup" })).toBe("shop:getCart:popup")
      }))
  })
})
