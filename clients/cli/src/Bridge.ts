/**
 * One MCP server for the host, in either era (2025's `initialize` or 2026-07-28's `server/discover`
 * and per-request `_meta`): the hub's tools relayed as they are (progress, cancellation and
 * list_changed included), plus the browser_* tools forwarded to the user's extension. Calls that
 * cannot reach Switchboard get an error result at once; the links reconnect on their own.
 */
import { type CallToolResult, ProtocolError, ProtocolErrorCode, Server, type Tool, type Transport } from "@modelcontextprotocol/server"
import { serveStdio, type StdioServerHandle } from "@modelcontextprotocol/server/stdio"
import * as Either from "effect/Either"
import { BrowserLink, NoExtension } from "./BrowserLink.ts"
import { browserTools, byName } from "./BrowserTools.ts"
import { Hub } from "./Hub.ts"
import { RpcError } from "./JsonRpcSocket.ts"
import { describe, type Log } from "./Log.ts"
import type { Options } from "./Options.ts"
import { Refused } from "./Refused.ts"
import { StartupGate } from "./StartupGate.ts"
import { Unreachable } from "./Unreachable.ts"
import { type CallOptions, HubRefusal, type ToolCall } from "./Upstream.ts"

/** How long a host's first tools/list waits for the hub's first answer (so it is complete). */
const FIRST_LIST_WAIT = 3_000
/**
 * How long a host's initialize waits for the hub's first connection before it fails as unreachable:
 * long enough for a few reconnects through a server that is still starting (backoff 250 ms, 500 ms,
 * 1 s, 2 s), short of the 10 s and more that hosts allow a server to start.
 */
const STARTUP_WAIT = 5_000

const failed = (text: string): CallToolResult => ({ isError: true, content: [{ type: "text", text }] })

/** The server instance serving the host now, and in which era. */
interface Serving {
  readonly server: Server
  readonly era: "legacy" | "modern"
  /** A legacy host hears list_changed only once it has said `notifications/initialized`. */
  initialized: boolean
}

export class Bridge {
  private readonly hub: Hub
  private readonly browser: BrowserLink | undefined
  private serving: Serving | undefined
  private handle: StdioServerHandle | undefined

  constructor(
    private readonly options: Options,
    private readonly log: Log,
    private readonly version: string
  ) {
    this.hub = new Hub({
      wsUrl: options.hubUrl,
      httpUrl: options.hubHttpUrl,
      name: options.url,
      token: options.token,
      version,
      log,
      onToolsChanged: () => this.toolsChanged()
    })
    this.browser = options.browser ? new BrowserLink({ url: options.proxyUrl, name: options.url, token: options.token, extension: options.extension, log }) : undefined
  }

  /**
   * Starts both upstream links, then serves the host on `transport` in whichever era its opening
   * message asks for: the SDK's `serveStdio` tells `initialize` from `server/discover` and a `_meta`
   * envelope, answers `server/discover` and `subscriptions/listen` for a modern host, and asks
   * `instance` for the server of that era.
   */
  serve(transport: Transport): void {
    this.hub.start()
    this.browser?.start()
    this.handle = serveStdio(({ era }) => this.instance(era), {
      transport: new StartupGate(transport, () => this.hub.startup(STARTUP_WAIT)),
      onerror: (e) => this.log.warn(`host connection: ${describe(e)}`)
    })
  }

  async stop(): Promise<void> {
    this.browser?.stop()
    await this.hub.stop()
    await this.handle?.close().catch(() => {})
  }

  /** One server of the bridge's tools; the same handlers serve either era. */
  private instance(era: "legacy" | "modern"): Server {
    const server = new Server(
      { name: "switchboard-mcp", version: this.version, title: "Switchboard" },
      {
        capabilities: { tools: { listChanged: true } },
        instructions:
          "Tools named website_tool_* run in the user's open web pages through Switchboard; browser_* tools drive the user's browser through the Switchboard extension."
      }
    )
    const serving: Serving = { server, era, initialized: false }
    // A modern host is served from its first request; a probe instance the host abandons for
    // `initialize` is replaced by the legacy one the SDK asks for next.
    this.serving = serving
    server.oninitialized = () => (serving.initialized = true)
    server.setRequestHandler("tools/list", () => this.listTools())
    server.setRequestHandler("tools/call", (request, ctx) => {
      const { name } = request.params
      const browserTool = this.browser === undefined ? undefined : byName.get(name)
      if (browserTool !== undefined && this.browser !== undefined) return this.callBrowser(this.browser, name, request.params.arguments, ctx.mcpReq.signal)
      const token = ctx.mcpReq._meta?.progressToken
      const options: CallOptions = {
        signal: ctx.mcpReq.signal,
        ...(token === undefined
          ? {}
          : { onprogress: (p) => void ctx.mcpReq.notify({ method: "notifications/progress", params: { ...p, progressToken: token } }).catch(() => {}) })
      }
      return this.callHub({ name, arguments: request.params.arguments }, options)
    })
    return server
  }

  private toolsChanged() {
    const serving = this.serving
    // A modern host's change notifications go out on its subscriptions/listen streams (serveStdio
    // routes them there, and drops them when it has none).
    if (serving === undefined || (serving.era === "legacy" && !serving.initialized)) return
    serving.server.sendToolListChanged().catch((e: unknown) => this.log.warn(`could not tell the host its tools changed: ${describe(e)}`))
  }

  private async listTools(): Promise<{ tools: Array<Tool> }> {
    await this.hub.ready(FIRST_LIST_WAIT)
    const own = this.browser === undefined ? [] : browserTools.map((t) => t.tool)
    // A hub tool named like a browser tool would be unreachable; the browser's wins.
    const hub = (await this.hub.tools()).filter((t) => !(this.browser !== undefined && byName.has(t.name)))
    return { tools: [...(hub as Array<Tool>), ...own] }
  }

  private async callHub(params: ToolCall, options: CallOptions): Promise<CallToolResult> {
    await this.hub.ready(FIRST_LIST_WAIT)
    try {
      return await this.hub.call(params, options)
    } catch (e) {
      if (e instanceof Unreachable || e instanceof Refused) return failed(e.message)
      // The hub's own JSON-RPC errors (-32602 unknown tool, -32001 TabNotFound, ...) reach the host as
      // the hub sent them, code, message and data.
      if (e instanceof HubRefusal) throw e
      throw new ProtocolError(ProtocolErrorCode.InternalError, describe(e))
    }
  }

  private async callBrowser(browser: BrowserLink, name: string, args: unknown, signal: AbortSignal): Promise<CallToolResult> {
    const tool = byName.get(name)
    if (tool === undefined) throw new ProtocolError(ProtocolErrorCode.InvalidParams, `Unknown tool: ${name}`)
    const params = tool.params(args)
    if (Either.isLeft(params)) return failed(params.left)
    await browser.ready(FIRST_LIST_WAIT)
    try {
      return tool.answer(await browser.request(tool.method, params.right, signal))
    } catch (e) {
      if (e instanceof Unreachable || e instanceof NoExtension) return failed(e.message)
      if (e instanceof RpcError) return failed(`${name}: the browser extension answered: ${e.message}`)
      this.log.warn(`${name} failed: ${describe(e)}`)
      return failed(`${name} failed: ${describe(e)}`)
    }
  }
}
