/**
 * The command line of `switchboard-mcp`, with SWITCHBOARD_* environment variables as fallbacks.
 * Pure: `main.ts` hands in argv and the environment, and decides what to print and how to exit.
 */
import { parseArgs } from "node:util"

export interface Options {
  /** The Switchboard base URL as given (http(s)), for messages. */
  readonly url: string
  /** MCP over WebSocket (the user's tool hub), the legacy era's link. */
  readonly hubUrl: URL
  /** The same hub over Streamable HTTP, where the 2026-07-28 era is spoken. */
  readonly hubHttpUrl: URL
  /** The MCP Proxy Protocol's client endpoint (browser control). */
  readonly proxyUrl: URL
  readonly token: string
  /** An extension id or name; unset picks one (see `usage`). */
  readonly extension: string | undefined
  readonly browser: boolean
}

export type Parsed =
  | { readonly _tag: "Run"; readonly options: Options }
  | { readonly _tag: "Help" }
  | { readonly _tag: "Version" }
  | { readonly _tag: "Invalid"; readonly message: string }

export const usage = `Usage: switchboard-mcp --url <http(s)://host:port> --token <jwt> [options]

A stdio MCP server for MCP hosts (Claude Desktop, Claude Code, Cursor, VS Code). It relays every
tool of your Switchboard hub (/hub) and adds browser_* tools that drive your browser extension
through the MCP Proxy Protocol (/mcp). Stdout carries MCP only; logs go to stderr. Hosts of
either MCP era are served (initialize, or 2026-07-28's server/discover); towards /hub the bridge
speaks 2026-07-28 over HTTP when Switchboard offers it, else MCP over WebSocket.

Options:
  --url <url>          Switchboard base URL, e.g. http://127.0.0.1:8080 (env SWITCHBOARD_URL).
                       ws(s)://<host>/hub and /mcp are derived from it; a path prefix is kept.
  --token <jwt>        Your access token (env SWITCHBOARD_TOKEN; prefer the variable, since
                       arguments show in process listings).
  --extension <id>     Which of your browser extensions to drive, by id (ext-…) or by name
                       (env SWITCHBOARD_EXTENSION). Default: the only one; if several are
                       connected, the first the server lists (the others are named on stderr).
  --no-browser         Relay the hub's tools only; no browser_* tools, no /mcp connection.
  --help               Show this help.
  --version            Show the version.

When Switchboard is unreachable the bridge keeps running and reconnects (250 ms doubling to 10 s,
with jitter); tool calls meanwhile return an error result saying so, and tools/list keeps the
last hub tools it saw. It exits when stdin closes or on SIGTERM/SIGINT.
`

const invalid = (message: string): Parsed => ({ _tag: "Invalid", message })

/** The WebSocket (or HTTP) URL of `path` under the base URL, keeping any path prefix the base has. */
const endpoint = (base: URL, path: string, scheme: "ws" | "http" = "ws") => {
  const url = new URL(base.href.endsWith("/") ? base.href : `${base.href}/`)
  const secure = base.protocol === "https:" || base.protocol === "wss:"
  url.protocol = `${scheme}${secure ? "s" : ""}:`
  url.pathname = `${url.pathname}${path}`
  url.search = ""
  url.hash = ""
  return url
}

const nonEmpty = (s: string | undefined) => (s === undefined || s.trim() === "" ? undefined : s.trim())

export const parse = (argv: ReadonlyArray<string>, env: Readonly<Record<string, string | undefined>>): Parsed => {
  let values
  try {
    ;({ values } = parseArgs({
      args: [...argv],
      strict: true,
      allowPositionals: false,
      options: {
        url: { type: "string" },
        token: { type: "string" },
        extension: { type: "string" },
        "no-browser": { type: "boolean" },
        help: { type: "boolean", short: "h" },
        version: { type: "boolean", short: "v" }
      }
    }))
  } catch (e) {
    return invalid(e instanceof Error ? e.message : String(e))
  }
  if (values.help === true) return { _tag: "Help" }
  if (values.version === true) return { _tag: "Version" }

  const url = nonEmpty(values.url) ?? nonEmpty(env["SWITCHBOARD_URL"])
  if (url === undefined) return invalid("missing --url (or SWITCHBOARD_URL): the Switchboard base URL, e.g. --url http://127.0.0.1:8080")
  let base: URL
  try {
    base = new URL(url)
  } catch {
    return invalid(`--url ${JSON.stringify(url)} is not a URL; expected e.g. http://127.0.0.1:8080`)
  }
  if (!["http:", "https:", "ws:", "wss:"].includes(base.protocol)) {
    return invalid(`--url must be http(s)://host:port (ws(s) works too), not ${base.protocol}`)
  }
  const token = nonEmpty(values.token) ?? nonEmpty(env["SWITCHBOARD_TOKEN"])
  if (token === undefined) return invalid("missing --token (or SWITCHBOARD_TOKEN): your Switchboard access token (npm run token -- --sub <you>)")

  return {
    _tag: "Run",
    options: {
      url: base.href.replace(/\/$/, ""),
      hubUrl: endpoint(base, "hub"),
      hubHttpUrl: endpoint(base, "hub", "http"),
      proxyUrl: endpoint(base, "mcp"),
      token,
      extension: nonEmpty(values.extension) ?? nonEmpty(env["SWITCHBOARD_EXTENSION"]),
      browser: values["no-browser"] !== true
    }
  }
}
