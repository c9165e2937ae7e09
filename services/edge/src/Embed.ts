/**
 * `GET /embed`: the inner-frame page of the postMessage transport (clients/postmessage), through
 * which a web app of an allowed origin reaches the user's `/hub` from an iframe. The page and its
 * script are static: the allowed origins go in a `<meta>` tag, never a secret, and the CSP lets
 * the page run only its own script, talk only to this edge, and be framed only by those origins.
 */
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { readFile } from "node:fs/promises"
import type * as Http from "node:http"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"
import * as EdgeConfig from "./Config.ts"

export const PAGE_PATH = "/embed"
const SCRIPT_PATH = "/embed/embed.js"

const escape = (text: string) => text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`)

const page = (origins: ReadonlyArray<string>) => `<!doctype html>
<html lang="en">
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="switchboard-embed-origins" content="${escape(origins.join(" "))}">
<title>Switchboard</title>
<main>
  <section id="setup" hidden>
    <h1>Connect Switchboard</h1>
    <p><strong id="asking"></strong> asks to use your Switchboard tools: every tool of every tab you have connected.</p>
    <p><label>Your Switchboard token <input id="token" type="password" autocomplete="off"></label></p>
    <p><button id="allow" type="button">Allow</button> <button id="cancel" type="button">Cancel</button></p>
    <p id="status" role="status"></p>
  </section>
  <p id="refused" role="alert" hidden></p>
</main>
<script src="${SCRIPT_PATH}"></script>
</html>
`

const csp = (origins: ReadonlyArray<string>) =>
  [
    "default-src 'none'",
    "script-src 'self'",
    // 'self' covers ws(s):// to this host: the page's only connection is its /hub session.
    "connect-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    `frame-ancestors ${origins.length === 0 ? "'none'" : origins.join(" ")}`
  ].join("; ")

/** Where the package build puts the page's script, found through the workspace's node_modules. */
const defaultScript = () => join(dirname(createRequire(import.meta.url).resolve("@switchboard/postmessage")), "..", "dist", "embed.js")

export interface Embed {
  readonly serves: (path: string) => boolean
  readonly handle: (req: Http.IncomingMessage, res: Http.ServerResponse, path: string) => void
}

export const make = Effect.gen(function*() {
  const origins = yield* EdgeConfig.embedAllowedOrigins
  const configured = yield* EdgeConfig.embedScript
  const file = Option.getOrElse(configured, () => {
    try {
      return defaultScript()
    } catch {
      return "@switchboard/postmessage/dist/embed.js"
    }
  })
  const script = yield* Effect.tryPromise(() => readFile(file, "utf8")).pipe(
    Effect.tapError(() => Effect.logWarning(`/embed is unavailable: no script at ${file} (build it with npm run build -w @switchboard/postmessage)`)),
    Effect.option
  )
  if (origins.length === 0) yield* Effect.logInfo("/embed: EMBED_ALLOWED_ORIGINS is empty, so no web app may embed it")
  const html = page(origins)
  const headers = {
    "content-security-policy": csp(origins),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache"
  }

  const send = (res: Http.ServerResponse, status: number, type: string, body: string) => {
    res.writeHead(status, { ...headers, "content-type": type, "content-length": Buffer.byteLength(body) })
    res.end(body)
  }

  const embed: Embed = {
    serves: (path) => path === PAGE_PATH || path === SCRIPT_PATH,
    handle: (req, res, path) => {
      if (req.method !== "GET" && req.method !== "HEAD") return send(res, 405, "text/plain; charset=utf-8", "GET only\n")
      if (Option.isNone(script)) return send(res, 503, "text/plain; charset=utf-8", "the /embed page is not built\n")
      if (path === SCRIPT_PATH) return send(res, 200, "text/javascript; charset=utf-8", script.value)
      send(res, 200, "text/html; charset=utf-8", html)
    }
  }
  return embed
})
