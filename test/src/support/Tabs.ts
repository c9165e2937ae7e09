/**
 * MCP-B peers as tests drive them. A tab is a real MCP server (the SDK's `McpServer`) behind a
 * small bridge that does what an extension's content script does: say hello, relay the page's
 * tools (again whenever the page says they changed), run `browser/executeTool` as `tools/call`
 * with progress and cancellation. A hub client is the SDK's own `Client` over its
 * `WebSocketClientTransport`.
 */
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { WebSocketClientTransport } from "@modelcontextprotocol/sdk/client/websocket.js"
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js"
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js"
import type { RequestHandlerExtra } from "@modelcontextprotocol/sdk/shared/protocol.js"
import { type ServerNotification, type ServerRequest, ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js"
import { expect } from "@effect/vitest"
import * as Effect from "effect/Effect"
import { WebSocket } from "ws"
import * as z from "zod"
import { connect } from "./Client.ts"
import { token } from "./Stack.ts"

// The SDK's WebSocket transport uses the global WebSocket, which Node 20 does not have.
globalThis.WebSocket ??= WebSocket as unknown as typeof globalThis.WebSocket

/** Tools as the page lists them, every field kept (the SDK's own schema would drop `annotations.cache`). */
const RawTools = z.looseObject({ tools: z.array(z.looseObject({ name: z.string() })) })

export interface TabOptions {
  readonly user: string
  readonly tabId: number
  readonly url: string
  readonly title?: string
  readonly active?: boolean
  /** Sent as the socket's Origin header. */
  readonly origin?: string
  /**
   * How the bridge gives its token: in the URL (`?token=`, as older clients do) or in-band, as an
   * `authenticate` message before anything else (as the extension does).
   */
  readonly auth?: "query" | "in-band"
}

export interface Executed {
  readonly id: string
  readonly toolName: string
  readonly args: unknown
}

export class TabBridge {
  /** Every `browser/executeTool` this tab received, in order. */
  readonly executed: Array<Executed> = []
  private readonly inflight = new Map<string, AbortController>()
  readonly closed: Promise<{ readonly code: number; readonly reason: string }>

  private constructor(
    readonly socket: WebSocket,
    readonly page: Client
  ) {
    this.closed = new Promise((resolve) => socket.on("close", (code, reason) => resolve({ code, reason: reason.toString() })))
    socket.on("message", (data) => void this.onMessage(data.toString()))
  }

  static async open(ws: string, server: McpServer, options: TabOptions & { readonly token: string }) {
    const [pageSide, bridgeSide] = InMemoryTransport.createLinkedPair()
    await server.connect(pageSide)
    const page = new Client({ name: "test-tab-bridge", version: "0.0.0" })
    await page.connect(bridgeSide)
    const inBand = options.auth === "in-band"
    const socket = new WebSocket(inBand ? `${ws}/tabs` : `${ws}/tabs?token=${options.token}`, options.origin === undefined ? {} : { origin: options.origin })
    await new Promise<void>((resolve, reject) => {
      socket.once("open", () => resolve())
      socket.once("error", reject)
      socket.once("unexpected-response", (_req, res) => reject(new Error(`upgrade refused with ${res.statusCode}`)))
    })
    const bridge = new TabBridge(socket, page)
    if (inBand) bridge.send({ jsonrpc: "2.0", method: "authenticate", params: { token: options.token } })
    bridge.send({
      jsonrpc: "2.0",
      method: "browser/hello",
      params: { tabId: options.tabId, url: options.url, ...(options.title === undefined ? {} : { title: options.title }), ...(options.active === undefined ? {} : { active: options.active }) }
    })
    page.setNotificationHandler(ToolListChangedNotificationSchema, () => bridge.register("browser/updateTools"))
    await bridge.register("browser/registerTools")
    return bridge
  }

  send(message: object | string) {
    this.socket.send(typeof message === "string" ? message : JSON.stringify(message))
  }

  /** Relays the page's current tools. */
  async register(method: "browser/registerTools" | "browser/updateTools") {
    const { tools } = await this.page.request({ method: "tools/list" }, RawTools)
    this.send({ jsonrpc: "2.0", method, params: { tools } })
  }

  activate() {
    this.send({ jsonrpc: "2.0", method: "browser/activated", params: {} })
  }

  close() {
    this.socket.close(1000)
    return this.closed
  }

  private async onMessage(raw: string) {
    const m = JSON.parse(raw) as { id?: string; method?: string; params?: Record<string, unknown> }
    if (m.method === "notifications/cancelled") {
      this.inflight.get(String(m.params?.["requestId"]))?.abort(m.params?.["reason"])
      return
    }
    if (m.method !== "browser/executeTool" || m.id === undefined) return
    const id = m.id
    const params = m.params ?? {}
    const toolName = String(params["toolName"])
    this.executed.push({ id, toolName, args: params["args"] })
    const meta = params["_meta"] as { progressToken?: string } | undefined
    const progressToken = meta?.progressToken
    const abort = new AbortController()
    this.inflight.set(id, abort)
    try {
      const result = await this.page.callTool({ name: toolName, arguments: params["args"] as Record<string, unknown> }, undefined, {
        signal: abort.signal,
        ...(progressToken === undefined
          ? {}
          : { onprogress: (p) => this.send({ jsonrpc: "2.0", method: "notifications/progress", params: { ...p, progressToken } }) })
      })
      this.send({ jsonrpc: "2.0", id, result: { success: true, payload: result } })
    } catch (e) {
      if (!abort.signal.aborted) this.send({ jsonrpc: "2.0", id, result: { success: false, payload: e instanceof Error ? e.message : String(e) } })
    } finally {
      this.inflight.delete(id)
    }
  }
}

export interface PageOptions {
  readonly cache?: boolean
  /** Every call waits for this before it answers. */
  readonly gate?: Promise<void>
}

/** A page's MCP server with the given tools; each answers `<label>:<tool>:<text>`. */
export const page = (label: string, tools: ReadonlyArray<string>, options: PageOptions = {}) => {
  const server = new McpServer({ name: label, version: "1.0.0" })
  for (const name of tools) {
    server.registerTool(
      name,
      {
        description: `${name} on ${label}`,
        inputSchema: { text: z.string().optional() },
        ...(options.cache ? { annotations: { cache: true } as Record<string, unknown> } : {})
      },
      async ({ text }) => {
        await options.gate
        return { content: [{ type: "text" as const, text: `${label}:${name}:${text ?? ""}` }] }
      }
    )
  }
  return server
}

type ToolExtra = RequestHandlerExtra<ServerRequest, ServerNotification>

/**
 * A page whose tool `long` reports `steps` progress notifications, 20 ms apart, then answers
 * `done <steps>`; `then` runs between the two (to hold the call, or watch for its cancellation).
 * Real work takes a while: the SDK client runs notification handlers a microtask after it settles
 * a response that arrived in the same read, so progress sent in the same instant as the result
 * would reach it too late.
 */
export const progressPage = (then?: (steps: number, extra: ToolExtra) => Promise<void>) => {
  const server = new McpServer({ name: "long", version: "1.0.0" })
  server.registerTool("long", { inputSchema: { steps: z.number() } }, async ({ steps }, extra) => {
    for (let i = 1; i <= steps; i++) {
      const progressToken = extra._meta?.progressToken
      if (progressToken !== undefined) {
        await extra.sendNotification({ method: "notifications/progress", params: { progressToken, progress: i, total: steps } })
      }
      await new Promise((resolve) => setTimeout(resolve, 20))
    }
    await then?.(steps, extra)
    return { content: [{ type: "text" as const, text: `done ${steps}` }] }
  })
  return server
}

/** The text of a tool result's first content item. */
export const textOf = (result: unknown) => ((result as { content: Array<{ text: string }> }).content[0]?.text)

/** A tab of `options.user` at the edge `ws`, serving `server`'s tools; closed with the scope. */
export const tab = (ws: string, server: McpServer, options: TabOptions) =>
  Effect.acquireRelease(
    Effect.flatMap(token({ sub: options.user }), (t) => Effect.promise(() => TabBridge.open(ws, server, { ...options, token: t }))),
    (bridge) => Effect.sync(() => bridge.socket.terminate())
  )

/** The SDK's MCP client connected to `/hub` as `user` (token in the query); closed with the scope. */
export const hub = (ws: string, user: string) =>
  Effect.acquireRelease(
    Effect.gen(function*() {
      const t = yield* token({ sub: user })
      const client = new Client({ name: "test-hub-client", version: "0.0.0" })
      const changes: Array<number> = []
      client.setNotificationHandler(ToolListChangedNotificationSchema, () => void changes.push(Date.now()))
      yield* Effect.promise(() => client.connect(new WebSocketClientTransport(new URL(`${ws}/hub?token=${t}`))))
      return { client, changes }
    }),
    ({ client }) => Effect.promise(() => client.close())
  )

/** Polls `tools/list` until `ok` holds of the names (every 10 ms, for up to 5 s). */
export const toolsUntil = (client: Client, ok: (names: ReadonlyArray<string>) => boolean) =>
  Effect.gen(function*() {
    const started = Date.now()
    for (;;) {
      const { tools } = yield* Effect.promise(() => client.listTools())
      const names = tools.map((t) => t.name)
      if (ok(names)) return tools
      if (Date.now() - started > 5_000) return yield* Effect.dieMessage(`tools/list never matched; last: ${JSON.stringify(names)}`)
      yield* Effect.sleep("10 millis")
    }
  })

/** A `/tabs` socket driven frame by frame (see support/Client.ts), authenticated as `user`. */
export const rawTab = (ws: string, user: string, origin?: string) =>
  Effect.flatMap(token({ sub: user }), (t) => connect(`${ws}/tabs?token=${t}`, origin === undefined ? {} : { origin }))

/** The frames a tab bridge sends, as plain objects. */
export const tabFrames = {
  hello: (tabId: number, url: string, extra: { readonly title?: string; readonly id?: string | number } = {}) => ({
    jsonrpc: "2.0",
    ...(extra.id === undefined ? {} : { id: extra.id }),
    method: "browser/hello",
    params: { tabId, url, ...(extra.title === undefined ? {} : { title: extra.title }) }
  }),
  register: (tools: ReadonlyArray<unknown>, id?: string | number) => ({
    jsonrpc: "2.0",
    ...(id === undefined ? {} : { id }),
    method: "browser/registerTools",
    params: { tools }
  }),
  tool: (name: string, extra: object = {}) => ({ name, inputSchema: { type: "object" }, ...extra })
}

/** A raw `/hub` socket (subprotocol mcp) that has completed initialize. */
export const rawHub = (ws: string, user: string) =>
  Effect.gen(function*() {
    const c = yield* connect(`${ws}/hub?token=${yield* token({ sub: user })}`, { protocols: ["mcp"] })
    c.send({ jsonrpc: "2.0", id: 0, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "0" } } })
    expect(yield* c.next).toMatchObject({ id: 0, result: { protocolVersion: "2025-06-18" } })
    c.send({ jsonrpc: "2.0", method: "notifications/initialized" })
    return c
  })
