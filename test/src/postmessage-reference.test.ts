/**
 * Switchboard's `/embed` against the reference implementation of the postMessage transport
 * (jmandel/mcp-postmessage, as its fork horner/mcp-postmessage holds it), in headless Chromium:
 * both revisions of its outer frame, copied verbatim under test/fixtures/mcp-postmessage/, set up
 * `/embed` and call a tab's tool from a page of another origin, the way the reference's own demo
 * does. Each revision trips on something of its own (issue 27): it listens for the handshake only
 * after the frame's `load`, the later one wants a version range, both read the title as
 * `displayName`, and its transport's `sessionId` makes the SDK `Client` skip `initialize`.
 */
import { describe, expect, layer } from "@effect/vitest"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { Registry } from "@switchboard/registry"
import { build, type Plugin } from "esbuild"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import type { BrowserContext, Page } from "playwright-core"
import { buildEmbedScript } from "../../clients/postmessage/build.ts"
import { type Asset, serve as serveAssets } from "../../clients/postmessage/test/PageServer.ts"
import { launch } from "./support/Browser.ts"
import { serve, token } from "./support/Stack.ts"
import { page as tabPage, tab } from "./support/Tabs.ts"

const fixtures = fileURLToPath(new URL("../fixtures/mcp-postmessage/", import.meta.url))

/** The two revisions of the reference's outer frame (see the fixtures' README). */
const revisions = [
  { commit: "62a6d9b26aa24c94a5beee211c381324ed5bd3ab", says: "protocolVersion" },
  { commit: "dce7294829e3b1a4c8aed2887f3ab559765d868c", says: "minProtocolVersion and maxProtocolVersion" }
] as const

/**
 * Resolves the reference's own import aliases (its tsconfig's `$sdk/*` and `$protocol/*`, `.js`
 * naming the `.ts` source) and the demo page's `reference/outer-frame` to one revision's files.
 */
const referenceAt = (commit: string): Plugin => ({
  name: "mcp-postmessage-reference",
  setup(b) {
    const src = join(fixtures, commit, "src")
    b.onResolve({ filter: /^reference\/outer-frame$/ }, () => ({ path: join(src, "sdk/transport/postmessage/outer-frame.ts") }))
    b.onResolve({ filter: /^\$(sdk|protocol)\// }, ({ path }) => ({
      path: join(src, path.replace(/^\$/, "").replace(/\.js$/, ".ts"))
    }))
  }
})

/** The demo page of one revision: the reference outer frame and the MCP SDK's Client, bundled. */
const demoPage = (commit: string) =>
  Effect.promise(async (): Promise<Record<string, Asset>> => {
    const bundle = await build({
      entryPoints: [join(fixtures, "demo-page.js")],
      bundle: true,
      write: false,
      platform: "browser",
      target: "es2022",
      format: "iife",
      logLevel: "warning",
      plugins: [referenceAt(commit)]
    })
    return {
      [`/${commit}.js`]: { type: "text/javascript; charset=utf-8", body: bundle.outputFiles[0]?.text ?? "" },
      [`/${commit}.html`]: {
        type: "text/html; charset=utf-8",
        // The setup iframe as the demo's modal has it: hidden until the server asks to be seen.
        body: `<!doctype html><meta charset="utf-8"><title>mcp-postmessage demo ${commit}</title>
<iframe id="setup" hidden title="Server Setup" sandbox="allow-scripts allow-same-origin allow-forms"></iframe>
<div id="transports"></div>
<script src="/${commit}.js"></script>`
      }
    }
  })

interface Harness {
  readonly browser: BrowserContext
  /** The demo pages' origin; Switchboard's edge is another port of the same host (same site). */
  readonly a: string
  readonly embedScript: string
}
class ReferencePages extends Context.Tag("test/ReferencePages")<ReferencePages, Harness>() {}

const harness = Layer.scoped(
  ReferencePages,
  Effect.gen(function*() {
    const dir = yield* Effect.acquireRelease(
      Effect.promise(() => mkdtemp(join(tmpdir(), "sb-embed-"))),
      (d) => Effect.promise(() => rm(d, { recursive: true, force: true }))
    )
    const embedScript = join(dir, "embed.js")
    yield* Effect.promise(() => buildEmbedScript(embedScript))
    const pages = yield* Effect.forEach(revisions, ({ commit }) => demoPage(commit))
    const port = yield* serveAssets(Object.assign({}, ...pages))
    const browser = yield* launch()
    return { browser, a: `http://127.0.0.1:${port}`, embedScript }
  })
)

interface DemoWindow {
  setUp(serverUrl: string, sessionId: string): Promise<unknown>
  connect(serverUrl: string, sessionId: string): Promise<unknown>
  callTool(name: string, args: Readonly<Record<string, unknown>>): Promise<unknown>
}

/** A step of the demo page, bounded: a handshake the reference never hears would wait forever. */
const step = <A>(what: string, page: Page, console: ReadonlyArray<string>, run: (p: Page) => Promise<A>) =>
  Effect.promise(() => run(page)).pipe(
    Effect.timeoutFail({
      duration: "45 seconds",
      onTimeout: () => new Error(`${what} did not finish within 45 s; the page's console said:\n${console.slice(-15).join("\n")}`)
    }),
    Effect.orDie
  )

let sessions = 0

// Two cores shared with other suites: a step that takes 5 s alone has been seen to take 12 s.
layer(harness, { excludeTestServices: true, timeout: "150 seconds" })("the reference postMessage outer frame and /embed", (it) => {
  describe.each(revisions)("revision $commit (its handshake says $says)", ({ commit }) => {
    it.scoped("completes setup across origins, unmodified, then lists and calls a tool of the user's tab", () =>
      Effect.gen(function*() {
        const { a, browser, embedScript } = yield* ReferencePages
        const { url, ws } = yield* serve(Registry.layer, { EMBED_ALLOWED_ORIGINS: a, EMBED_SCRIPT: embedScript })
        yield* tab(ws, tabPage("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/cart" })
        const alice = yield* token({ sub: "alice" })
        const page = yield* Effect.acquireRelease(Effect.promise(() => browser.newPage()), (p) => Effect.promise(() => p.close()))
        const console: Array<string> = []
        page.on("console", (m) => console.push(`${m.type()}: ${m.text()}`))
        yield* Effect.promise(() => page.goto(`${a}/${commit}.html`))
        const serverUrl = `${url}/embed`
        const sessionId = `reference-${process.pid}-${++sessions}`

        // The reference shows the setup frame once /embed asks to be seen; the user gives the token there.
        const form = page.frameLocator("iframe[title='Server Setup']")
        const setup = yield* step("setup", page, console, async (p) => {
          const result = p.evaluate(([u, s]) => (window as unknown as DemoWindow).setUp(u, s), [serverUrl, sessionId] as const)
          const user = (async () => {
            await form.locator("#asking").waitFor({ state: "visible" })
            await form.locator("#token").fill(alice)
            await form.locator("#allow").click()
          })()
          // A setup that fails never shows the form: its answer is what the test reports.
          user.catch(() => undefined)
          await Promise.race([user, result])
          return result
        })
        expect(setup).toEqual({
          success: true,
          displayName: "Switchboard",
          transportVisibility: { requirement: "hidden" },
          ephemeralMessage: "Switchboard connected"
        })

        const connected = yield* step("connect", page, console, (p) => p.evaluate(([u, s]) => (window as unknown as DemoWindow).connect(u, s), [serverUrl, sessionId] as const))
        expect(connected).toEqual({ ok: true, tools: ["website_tool_shop_example_com_tab1_getCart"] })
        const called = yield* step("the tool call", page, console, (p) =>
          p.evaluate(([n, args]) => (window as unknown as DemoWindow).callTool(n, args), ["website_tool_shop_example_com_tab1_getCart", { text: "from the reference" }] as const))
        expect(called).toEqual({ ok: true, text: "shop:getCart:from the reference" })
      }))
  })
})
