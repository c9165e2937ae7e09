/**
 * The pages of the postMessage browser tests, served over loopback HTTP: the library's own
 * `<script>` bundle (built by build.ts, as a user gets it), the MCP SDK's `Client` and `McpServer`
 * bundled for the page, and the page scripts in pages/. One server is two origins
 * (`http://127.0.0.1:<port>` and `http://localhost:<port>`); two servers make three.
 */
import * as Effect from "effect/Effect"
import { build } from "esbuild"
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { buildScript } from "../build.ts"

const here = fileURLToPath(new URL(".", import.meta.url))

/** What the SDK page bundle defines as the global `McpSdk`. */
const sdkEntry = `
export { Client } from "@modelcontextprotocol/sdk/client/index.js"
export { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js"
export * as z from "zod"
`

export interface Asset {
  readonly body: string
  readonly type: string
}

const js = (body: string): Asset => ({ body, type: "text/javascript; charset=utf-8" })

/** A page that loads the library, the SDK and one page script. */
const page = (script: string): Asset => ({
  type: "text/html; charset=utf-8",
  body: `<!doctype html><meta charset="utf-8"><title>${script}</title>
<div id="frames"></div>
<script src="/postmessage.js"></script><script src="/sdk.js"></script><script src="/${script}.js"></script>`
})

/** Every asset, built once per test file. */
export const assets = Effect.promise(async () => {
  const dir = await mkdtemp(join(tmpdir(), "sb-postmessage-"))
  try {
    await buildScript(join(dir, "postmessage.js"))
    const library = await readFile(join(dir, "postmessage.js"), "utf8")
    const sdk = await build({
      stdin: { contents: sdkEntry, resolveDir: here, loader: "js" },
      bundle: true,
      write: false,
      platform: "browser",
      target: "es2022",
      format: "iife",
      globalName: "McpSdk",
      logLevel: "warning"
    })
    const routes: Record<string, Asset> = {
      "/postmessage.js": js(library.replace(/\/\/# sourceMappingURL=.*$/m, "")),
      "/sdk.js": js(sdk.outputFiles[0]?.text ?? ""),
      "/blank.html": { type: "text/html; charset=utf-8", body: "<!doctype html><title>blank</title><p>no MCP here</p>" }
    }
    for (const file of await readdir(join(here, "pages"))) {
      const name = file.replace(/\.js$/, "")
      routes[`/${name}.js`] = js(await readFile(join(here, "pages", file), "utf8"))
      routes[`/${name}.html`] = page(name)
    }
    return routes
  } finally {
    await rm(dir, { recursive: true, force: true })
  }
})

/** Serves `routes` on 127.0.0.1 for as long as the scope lives; resolves with the port. */
export const serve = (routes: Readonly<Record<string, Asset>>) =>
  Effect.acquireRelease(
    Effect.async<Http.Server>((resume) => {
      const server = Http.createServer((req, res) => {
        const asset = routes[new URL(req.url ?? "/", "http://x").pathname]
        if (asset === undefined) res.writeHead(404).end()
        else res.writeHead(200, { "content-type": asset.type, "cache-control": "no-store" }).end(asset.body)
      })
      server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
    }),
    (server) =>
      Effect.async<void>((resume) => {
        server.closeAllConnections()
        server.close(() => resume(Effect.void))
      })
  ).pipe(Effect.map((server) => (server.address() as AddressInfo).port))

/**
 * Three origins on loopback. `a` and `b` differ by port only: cross-origin but same-site, so an
 * iframe of `b` in a page of `a` keeps its localStorage, which Chromium as Playwright launches it
 * (third-party storage partitioning off) denies a cross-site (third-party) iframe. `c` is `a`'s server under another host name: cross-site.
 */
export const origins = Effect.gen(function*() {
  const routes = yield* assets
  const [one, two] = [yield* serve(routes), yield* serve(routes)]
  return { a: `http://127.0.0.1:${one}`, b: `http://127.0.0.1:${two}`, c: `http://localhost:${one}` }
})
