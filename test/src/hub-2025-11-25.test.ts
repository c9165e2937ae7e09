/**
 * MCP 2025-11-25 at `/hub`: the official SDK v1 client (whose latest revision it is) negotiates it
 * over Streamable HTTP and over WebSocket and calls a tab's tool, which is listed with the icons,
 * title and JSON Schema 2020-12 input schema its page gave; a client that asks for an older revision still gets that one.
 */
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js"
import { WebSocketClientTransport } from "@modelcontextprotocol/sdk/client/websocket.js"
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js"
import { CallToolRequestSchema, LATEST_PROTOCOL_VERSION, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js"
import { describe, expect, it } from "@effect/vitest"
import { Edge } from "@switchboard/edge"
import { Registry } from "@switchboard/registry"
import { Router } from "@switchboard/router"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { busLayer, stack, token } from "./support/Stack.ts"
import { rawHub, tab, textOf, toolsUntil } from "./support/Tabs.ts"

const services = Layer.mergeAll(Router.layer, Registry.layer)
/** One edge with the router and the registry, embedded bus; its base URL. */
const start = Effect.map(Layer.build(stack(busLayer(), { services })), (ctx) => Context.get(ctx, Edge.EdgeServer).url)

/** JSON Schema 2020-12, MCP 2025-11-25's default dialect: its keywords reach the client unchanged. */
const INPUT = {
  $schema: "https://json-schema.org/draft/2020-12/schema",
  type: "object" as const,
  $defs: { address: { type: "object", properties: { city: { type: "string" } } } },
  properties: { text: { type: "string" }, address: { $ref: "#/$defs/address" } },
  additionalProperties: false
}
const ICONS = [{ src: "https://shop.example.com/cart.png", mimeType: "image/png", sizes: ["48x48"] }, { src: "data:image/svg+xml;base64,PHN2Zy8+", theme: "dark" }]

/** A page whose one tool, `getCart`, has a title and icons (which McpServer's registerTool cannot give). */
const shop = () => {
  const server = new McpServer({ name: "shop", version: "1.0.0" }, { capabilities: { tools: {} } })
  server.server.setRequestHandler(ListToolsRequestSchema, () => ({
    tools: [{ name: "getCart", title: "Your cart", icons: ICONS, description: "The cart", inputSchema: INPUT }]
  }))
  server.server.setRequestHandler(CallToolRequestSchema, (request) => ({ content: [{ type: "text" as const, text: `cart:${String(request.params.arguments?.["text"])}` }] }))
  return server
}

/** The SDK's WebSocket transport, keeping the revision the client settled on (the SDK hands it to every transport that asks). */
class RecordingWebSocket extends WebSocketClientTransport {
  negotiated: string | undefined
  setProtocolVersion(version: string) {
    this.negotiated = version
  }
}

const TOOL = "website_tool_shop_example_com_tab1_getCart"

/** That `client` lists the shop's tool with its title and icons, and calls it. */
const listsAndCalls = (client: Client) =>
  Effect.gen(function*() {
    const [tool] = yield* toolsUntil(client, (names) => names.includes(TOOL))
    expect(tool).toMatchObject({ name: TOOL, title: "Your cart", icons: ICONS })
    expect(tool?.inputSchema).toEqual(INPUT)
    const result = yield* Effect.promise(() => client.callTool({ name: TOOL, arguments: { text: "now" } }))
    expect(textOf(result)).toBe("cart:now")
  })

describe("MCP 2025-11-25 at /hub", () => {
  it.scopedLive("the SDK v1 client negotiates 2025-11-25 over Streamable HTTP and calls a tab's tool", () =>
    Effect.gen(function*() {
      expect(LATEST_PROTOCOL_VERSION).toBe("2025-11-25")
      const base = yield* start
      yield* tab(base.replace("http", "ws"), shop(), { user: "alice", tabId: 1, url: "https://shop.example.com/cart" })
      const transport = new StreamableHTTPClientTransport(new URL(`${base}/hub`), { requestInit: { headers: { Authorization: `Bearer ${yield* token({ sub: "alice" })}` } } })
      const client = new Client({ name: "sdk-v1-http", version: "0.0.0" })
      yield* Effect.acquireRelease(Effect.promise(() => client.connect(transport)), () => Effect.promise(() => client.close()))
      expect(transport.protocolVersion).toBe("2025-11-25")
      expect(client.getServerVersion()).toMatchObject({ name: "switchboard-registry", title: "Switchboard tool hub" })
      yield* listsAndCalls(client)
    }))

  it.scopedLive("the SDK v1 client negotiates 2025-11-25 over WebSocket and calls a tab's tool", () =>
    Effect.gen(function*() {
      const base = yield* start
      const ws = base.replace("http", "ws")
      yield* tab(ws, shop(), { user: "alice", tabId: 1, url: "https://shop.example.com/cart" })
      const transport = new RecordingWebSocket(new URL(`${ws}/hub?token=${yield* token({ sub: "alice" })}`))
      const client = new Client({ name: "sdk-v1-ws", version: "0.0.0" })
      yield* Effect.acquireRelease(Effect.promise(() => client.connect(transport)), () => Effect.promise(() => client.close()))
      expect(transport.negotiated).toBe("2025-11-25")
      yield* listsAndCalls(client)
    }))

  it.scopedLive("a client that asks for 2025-06-18 gets 2025-06-18, and one that asks for an unknown revision gets 2025-11-25", () =>
    Effect.gen(function*() {
      const base = yield* start
      const ws = base.replace("http", "ws")
      const t = yield* token({ sub: "carol" })
      const overHttp = yield* Effect.promise(() =>
        fetch(`${base}/hub`, {
          method: "POST",
          headers: { authorization: `Bearer ${t}`, accept: "application/json, text/event-stream", "content-type": "application/json" },
          body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "0" } } })
        }).then((r) => r.json())
      )
      expect(overHttp).toMatchObject({ id: 1, result: { protocolVersion: "2025-06-18" } })
      // rawHub asks for 2025-06-18 and checks that it is answered with it.
      yield* rawHub(ws, "alice")
      const c = yield* rawHub(ws, "bob")
      c.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2031-01-01", capabilities: {}, clientInfo: { name: "raw", version: "0" } } })
      expect(yield* c.next).toMatchObject({ id: 1, result: { protocolVersion: "2025-11-25" } })
    }))
})
