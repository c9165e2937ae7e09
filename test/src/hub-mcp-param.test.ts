/**
 * MCP 2026-07-28's `Mcp-Param-*` headers at `/hub` (`basic/transports/streamable-http.mdx`, "Custom
 * Headers from Tool Parameters", and `server/tools.mdx`, "x-mcp-header"): a tab's tool that marks
 * arguments with `x-mcp-header` gets their values checked against the request's headers, on the
 * modern era only; a tool whose annotation is invalid is refused when its tab registers it.
 */
import { Client as ModernClient, StreamableHTTPClientTransport as ModernTransport } from "@modelcontextprotocol/client"
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js"
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js"
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js"
import { describe, expect, it } from "@effect/vitest"
import { Edge } from "@switchboard/edge"
import { Registry } from "@switchboard/registry"
import { Router } from "@switchboard/router"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import { modernMeta, modernPost } from "./support/Modern.ts"
import { busLayer, stack, token } from "./support/Stack.ts"
import { rawTab, tab, tabFrames, textOf } from "./support/Tabs.ts"

const services = Layer.mergeAll(Router.layer, Registry.layer)
/** One edge with the router and the registry, embedded bus; its base URL. */
const start = Effect.map(Layer.build(stack(busLayer(), { services })), (ctx) => Context.get(ctx, Edge.EdgeServer).url)

/** The specification's example, with an integer, a boolean and a nested argument mirrored too. */
const INPUT = {
  type: "object" as const,
  properties: {
    region: { type: "string", "x-mcp-header": "Region" },
    count: { type: "integer", "x-mcp-header": "Count" },
    dry: { type: "boolean", "x-mcp-header": "Dry" },
    target: { type: "object", properties: { zone: { type: "string", "x-mcp-header": "Zone" } } },
    query: { type: "string" }
  },
  required: ["query"]
}
const TOOL = "website_tool_db_example_com_tab1_execute_sql"

/** A page whose tool `execute_sql` has `x-mcp-header`s (McpServer's registerTool cannot say them); it answers its arguments as JSON. */
const database = () => {
  const server = new McpServer({ name: "db", version: "1.0.0" }, { capabilities: { tools: {} } })
  server.server.setRequestHandler(ListToolsRequestSchema, () => ({ tools: [{ name: "execute_sql", description: "SQL", inputSchema: INPUT }] }))
  server.server.setRequestHandler(CallToolRequestSchema, (request) => ({ content: [{ type: "text" as const, text: JSON.stringify(request.params.arguments ?? {}) }] }))
  return server
}

const call = (args: Record<string, unknown>) => ({ jsonrpc: "2.0", id: 7, method: "tools/call", params: { name: TOOL, arguments: args, _meta: modernMeta() } })

/** Polls the modern `tools/list` until the tab's tool is there. */
const listed = (base: string, t: string) =>
  modernPost(base, { jsonrpc: "2.0", id: 1, method: "tools/list", params: { _meta: modernMeta() } }, { token: t }).pipe(
    Effect.filterOrFail((r) => r.text.includes(TOOL), () => `${TOOL} never listed`),
    Effect.retry(Schedule.spaced("20 millis").pipe(Schedule.upTo("10 seconds"))),
    Effect.orDie
  )

describe("/hub, MCP 2026-07-28: Mcp-Param-* headers from x-mcp-header", () => {
  it.scopedLive("the SDK v2 client mirrors the annotated arguments into Mcp-Param-* itself (Base64 where needed) and its call passes; the SDK v1 client on the legacy era sends none and is not checked", () =>
    Effect.gen(function*() {
      const base = yield* start
      yield* tab(base.replace("http", "ws"), database(), { user: "alice", tabId: 1, url: "https://db.example.com/" })
      const t = yield* token({ sub: "alice" })
      yield* listed(base, t)

      const sent: Array<Headers> = []
      const client = new ModernClient({ name: "test-modern-client", version: "0.0.0" }, { versionNegotiation: { mode: { pin: "2026-07-28" } } })
      const transport = new ModernTransport(new URL(`${base}/hub`), {
        requestInit: { headers: { Authorization: `Bearer ${t}` } },
        fetch: (url, init) => {
          sent.push(new Headers(init?.headers))
          return fetch(url, init)
        }
      })
      yield* Effect.acquireRelease(Effect.promise(() => client.connect(transport)), () => Effect.promise(() => client.close()))
      // The SDK mirrors a tool's arguments from the definition it listed.
      yield* Effect.promise(() => client.listTools())
      const args = { region: "Hello, 世界", count: 3, dry: true, target: { zone: "b" }, query: "SELECT 1" }
      const result = yield* Effect.promise(() => client.callTool({ name: TOOL, arguments: args }))
      expect(JSON.parse(textOf(result) ?? "")).toEqual(args)
      const headers = sent.find((h) => h.get("mcp-method") === "tools/call")
      expect([headers?.get("mcp-param-region"), headers?.get("mcp-param-count"), headers?.get("mcp-param-dry"), headers?.get("mcp-param-zone")]).toEqual([
        "=?base64?SGVsbG8sIOS4lueVjA==?=",
        "3",
        "true",
        "b"
      ])

      const legacy = new Client({ name: "test-v1-client", version: "0.0.0" })
      yield* Effect.acquireRelease(
        Effect.promise(() => legacy.connect(new StreamableHTTPClientTransport(new URL(`${base}/hub`), { requestInit: { headers: { Authorization: `Bearer ${t}` } } }))),
        () => Effect.promise(() => legacy.close())
      )
      expect(JSON.parse(textOf(yield* Effect.promise(() => legacy.callTool({ name: TOOL, arguments: args }))) ?? "")).toEqual(args)
    }))

  it.scopedLive("a modern tools/call whose Mcp-Param-* headers do not say what its body does is refused with 400 and -32020, naming the header", () =>
    Effect.gen(function*() {
      const base = yield* start
      yield* tab(base.replace("http", "ws"), database(), { user: "alice", tabId: 1, url: "https://db.example.com/" })
      const t = yield* token({ sub: "alice" })
      yield* listed(base, t)
      const refusal = (args: Record<string, unknown>, headers: Record<string, string>) =>
        Effect.map(modernPost(base, call(args), { token: t, headers }), (r) => {
          const error = r.json()["error"] as { readonly code?: number; readonly message?: string } | undefined
          return [r.status, error?.code, error?.message]
        })
      const args = { region: "us-west1", count: 42, dry: false, target: { zone: "b" }, query: "q" }
      const noRegion = { "mcp-param-count": "42", "mcp-param-dry": "false", "mcp-param-zone": "b" }
      const right = { ...noRegion, "mcp-param-region": "us-west1" }

      // Right, and the spec's equivalents: Base64, an integer compared as a number, a name in any case, an undeclared header.
      const ok = yield* modernPost(base, call(args), { token: t, headers: { ...noRegion, "MCP-PARAM-REGION": "=?base64?dXMtd2VzdDE=?=", "mcp-param-count": "42.0", "mcp-param-other": "x" } })
      expect([ok.status, ok.json()["result"]]).toMatchObject([200, { content: [{ text: JSON.stringify(args) }] }])
      // An absent or null argument needs no header.
      expect((yield* modernPost(base, call({ count: 42, dry: false, target: { zone: "b" }, query: "q", region: null }), { token: t, headers: noRegion })).status).toBe(200)

      expect(yield* refusal(args, noRegion)).toEqual([400, -32020, "Header mismatch: Mcp-Param-Region header is missing, and arguments.region has a value"])
      expect(yield* refusal(args, { ...right, "mcp-param-region": "eu-west1" })).toEqual([400, -32020, 'Header mismatch: Mcp-Param-Region header value "eu-west1" does not match body value "us-west1"'])
      expect(yield* refusal(args, { ...right, "mcp-param-region": "=?base64?ZXUtd2VzdDE=?=" })).toEqual([
        400,
        -32020,
        'Header mismatch: Mcp-Param-Region header value "eu-west1" does not match body value "us-west1"'
      ])
      expect(yield* refusal(args, { ...right, "mcp-param-count": "43" })).toEqual([400, -32020, 'Header mismatch: Mcp-Param-Count header value "43" does not match body value "42"'])
      expect(yield* refusal(args, { ...right, "mcp-param-dry": "FALSE" })).toEqual([400, -32020, 'Header mismatch: Mcp-Param-Dry header value "FALSE" does not match body value "false"'])
      expect(yield* refusal(args, { ...right, "mcp-param-zone": "a" })).toEqual([400, -32020, 'Header mismatch: Mcp-Param-Zone header value "a" does not match body value "b"'])
      // A byte outside ASCII, as fetch sends a Latin-1 character: it had to be Base64.
      expect(yield* refusal({ ...args, region: "café" }, { ...right, "mcp-param-region": "caf\u00e9" })).toEqual([
        400,
        -32020,
        "Header mismatch: Mcp-Param-Region header has invalid characters; a value outside visible ASCII is sent as =?base64?…?="
      ])
      expect(yield* refusal(args, { ...right, "mcp-param-region": "=?base64?not base64?=" })).toEqual([400, -32020, "Header mismatch: Mcp-Param-Region header is not valid =?base64?…?= encoding"])
      // A header for an argument the body does not have: a proxy may have routed on it.
      const { region: _absent, ...withoutRegion } = args
      expect(yield* refusal(withoutRegion, right)).toEqual([400, -32020, "Header mismatch: Mcp-Param-Region header is present, but arguments.region has no value"])
    }))

  it.scopedLive("a tab's tool with an invalid x-mcp-header is refused at registration with the reason, and the rest of its list registers", () =>
    Effect.gen(function*() {
      const base = yield* start
      const ws = base.replace("http", "ws")
      const t = yield* rawTab(ws, "alice")
      t.send(tabFrames.hello(1, "https://db.example.com/", { id: "hi" }))
      expect(yield* t.next).toMatchObject({ id: "hi", result: { domain: "db.example.com" } })
      const annotated = (property: Record<string, unknown>) => ({ type: "object", properties: { p: property } })
      t.send(tabFrames.register([
        tabFrames.tool("spaced", { inputSchema: annotated({ type: "string", "x-mcp-header": "My Region" }) }),
        tabFrames.tool("number", { inputSchema: annotated({ type: "number", "x-mcp-header": "Size" }) }),
        tabFrames.tool("items", { inputSchema: annotated({ type: "array", items: { type: "string", "x-mcp-header": "Item" } }) }),
        tabFrames.tool("fine", { inputSchema: annotated({ type: "string", "x-mcp-header": "Region" }) })
      ], "reg"))
      expect(yield* t.next).toMatchObject({
        id: "reg",
        result: {
          registered: 1,
          rejected: [
            'tool "spaced": inputSchema: x-mcp-header "My Region" on property p is not an HTTP token (RFC 9110: no spaces, control characters or delimiters)',
            'tool "number": inputSchema: x-mcp-header "Size" on property p needs type string, integer or boolean, not "number"',
            'tool "items": inputSchema: x-mcp-header on property p is not statically reachable: only a chain of "properties" may lead to it (not items, oneOf/anyOf/allOf/not, if/then/else or $ref)'
          ]
        }
      })
    }))
})
