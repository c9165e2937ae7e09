/**
 * The README's Streamable HTTP host snippets, exercised: each one's URL and headers (its variables
 * filled in with a real token, its address with this test's edge) go to the SDK's unmodified
 * Streamable HTTP client, which lists and calls a tab's tool through `/hub`.
 */
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js"
import { describe, expect, it } from "@effect/vitest"
import { Registry } from "@switchboard/registry"
import { Router } from "@switchboard/router"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { readFileSync } from "node:fs"
import { fileURLToPath } from "node:url"
import { serve, token } from "./support/Stack.ts"
import { page, tab, textOf } from "./support/Tabs.ts"

const root = fileURLToPath(new URL("../../", import.meta.url))

interface Remote {
  readonly url: string
  readonly headers: Readonly<Record<string, string>>
}

/** Each host's URL and headers as its README snippet gives them, keyed by host. */
const snippets = (): ReadonlyMap<string, Remote> => {
  const readme = readFileSync(`${root}README.md`, "utf8")
  const section = readme.split(/^## Connecting MCP hosts \(Streamable HTTP\)$/m)[1]?.split(/^## /m)[0] ?? ""
  const found = new Map<string, Remote>()
  for (const part of section.split(/^### /m).slice(1)) {
    const host = part.split("\n")[0] ?? ""
    const json = /^```json\n([\s\S]*?)^```$/m.exec(part)?.[1]
    if (json !== undefined) {
      const config = JSON.parse(json) as Record<string, Record<string, Record<string, unknown>>>
      const server = (config["mcpServers"] ?? config["servers"])?.["switchboard"]
      found.set(host, { url: String(server?.["url"]), headers: (server?.["headers"] ?? {}) as Record<string, string> })
    }
    const add = /^claude mcp add --transport http switchboard-http (\S+) --header "([^:]+): ([^"]+)"$/m.exec(part)
    if (add !== null) found.set(host, { url: add[1] ?? "", headers: { [add[2] ?? ""]: add[3] ?? "" } })
  }
  return found
}

describe("Streamable HTTP host snippets", () => {
  it.scopedLive("each snippet's URL and headers list and call a tab's tool through /hub", () =>
    Effect.gen(function*() {
      const hosts = snippets()
      expect([...hosts.keys()]).toEqual(["Claude Code", "Cursor", "VS Code"])
      const { url, ws } = yield* serve(Layer.mergeAll(Router.layer, Registry.layer))
      yield* tab(ws, page("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      const t = yield* token({ sub: "alice" })
      const fill = (s: string) =>
        s.replaceAll("http://127.0.0.1:8080", url).replaceAll("$TOKEN", t).replaceAll("${env:SWITCHBOARD_TOKEN}", t).replaceAll("${input:switchboard-token}", t)
      for (const [host, remote] of hosts) {
        expect(remote.url, host).toBe("http://127.0.0.1:8080/hub")
        expect(Object.keys(remote.headers), host).toEqual(["Authorization"])
        const headers = Object.fromEntries(Object.entries(remote.headers).map(([k, v]) => [k, fill(v)]))
        expect(headers["Authorization"], host).toBe(`Bearer ${t}`)
        const client = new Client({ name: host, version: "0.0.0" })
        yield* Effect.acquireRelease(
          Effect.promise(() => client.connect(new StreamableHTTPClientTransport(new URL(fill(remote.url)), { requestInit: { headers } }))),
          () => Effect.promise(() => client.close())
        )
        const { tools } = yield* Effect.promise(() => client.listTools())
        const name = tools.map((tool) => tool.name).find((n) => n.endsWith("getCart"))
        expect(name, host).toBeDefined()
        const result = yield* Effect.promise(() => client.callTool({ name: name ?? "", arguments: { text: host } }))
        expect(textOf(result), host).toBe(`shop:getCart:${host}`)
      }
    }))
})
