/**
 * One MCP server for the host: the hub's tools relayed as they are (progress, cancellation and
 * list_changed included), plus the browser_* tools forwarded to the user's extension. Calls that
 * cannot reach Switchboard get an error result at once; the links reconnect on their own.
 */
import { Server } from "@modelcontextprotocol/sdk/server/index.js"
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js"
import {
  type CallToolResult,
  CallToolRequestSchema,
  ErrorCode,
  ListToolsRequestSchema,
  McpError,
  type Progress,
  type Tool
} from "@modelcontextprotocol/sdk/types.js"
import * as Either from "effect/Either"
import { BrowserLink, NoExtension } from "./BrowserLink.ts"
import { browserTools, byName } from "./BrowserTools.ts"
import { HubLink } from "./HubLink.ts"
import { RpcError } from "./JsonRpcSocket.ts"
import { describe, type Log } from "./Log.ts"
import type { Options } from "./Options.ts"
import { Refused } from "./Refused.ts"
import { StartupGate } from "./StartupGate.ts"
import { Unreachable } from "./Unreachable.ts"

/** How long a host's first tools/list waits for the hub's first answer (so it is complete). */
const FIRST_LIST_WAIT = 3_000
/**
 * How long a host's initialize waits for the hub's first connection before it fails as unreachable:
 * long enough for a few reconnects through a server that is still starting (backoff 250 ms, 500 ms,
 * 1 s, 2 s), short of the 10 s and more that hosts allow a server to start.
 */
const STARTUP_WAIT = 5_000

/** A JSON-RPC error of the hub's, as the SDK's server answers a thrown error: its code, message and data. */
class HubRefusal extends Error {
  readonly code: number
  readonly data: unknown
  constructor(e: McpError) {
    const prefix = `MCP error ${e.code}: `
    super(e.message.startsWith(prefix) ? e.message.slice(prefix.length) : e.message)
    this.code = e.code
    this.data = e.data
  }
}

const failed = (text: string): CallToolResult => ({ isError: true, content: [{ type: "text", text }] })

export class Bridge {
  readonly server: Server
  private readonly hub: HubLink
  private readonly browser: BrowserLink | undefined
  private initialized = false

  constructor(
    private readonly options: Options,
    private readonly log: Log,
    version: string
  ) {
    this.server = new Server(
      { name: "switchboard-mcp", version, title: "Switchboard" },
      {
        capabilities: { tools: { listChanged: true } },
        instructions:
          "Tools named website_tool_* run in the user's open web pages through Switchboard; browser_* tools drive the user's browser through the Switchboard extension."
      }
    )
    this.server.oninitialized = () => (this.initialized = true)
    this.hub = new HubLink({
      url: options.hubUrl,
      name: options.url,
      token: options.token,
      version,
      log,
      onToolsChanged: () => this.toolsChanged()
    })
    this.browser = options.browser ? new BrowserLink({ url: options.proxyUrl, name: options.url, token: options.token, extension: options.extension, log }) : undefined
    this.server.setRequestHandler(ListToolsRequestSchema, () => this.listTools())
    this.server.setRequestHandler(CallToolRequestSchema, (request, extra) => {
      const { name } = request.params
      const browserTool = this.browser === undefined ? undefined : byName.get(name)
      if (browserTool !== undefined && this.browser !== undefined) return this.callBrowser(this.browser, name, request.params.arguments, extra.signal)
      const token = request.params._meta?.progressToken
      const onprogress =
        token === undefined ? undefined : (p: Progress) => void extra.sendNotification({ method: "notifications/progress", params: { ...p, progressToken: token } }).catch(() => {})
      return this.callHub(request.params, { signal: extra.signal, ...(onprogress === undefined ? {} : { onprogress }) })
    })
  }

  /** Starts both upstream links, then serves the host on `transport`. */
  async serve(transport: Transport): Promise<void> {
    this.hub.start()
    this.browser?.start()
    await this.server.connect(new StartupGate(transport, () => this.hub.startup(STARTUP_WAIT)))
  }

  async stop(): Promise<void> {
    this.browser?.stop()
    await this.hub.stop()
    await this.server.close().catch(() => {})
  }

  private toolsChanged() {
    if (!this.initialized) return
    this.server.sendToolListChanged().catch((e: unknown) => this.log.warn(`could not tell the host its tools changed: ${describe(e)}`))
  }

  private async listTools(): Promise<{ tools: Array<Tool> }> {
    await this.hub.ready(FIRST_LIST_WAIT)
    const own = this.browser === undefined ? [] : browserTools.map((t) => t.tool)
    // A hub tool named like a browser tool would be unreachable; the browser's wins.
    const hub = (await this.hub.tools()).filter((t) => !(this.browser !== undefined && byName.has(t.name)))
    return { tools: [...(hub as Array<Tool>), ...own] }
  }

  private async callHub(params: Parameters<HubLink["call"]>[0], options: Parameters<HubLink["call"]>[1]): Promise<CallToolResult> {
    await this.hub.ready(FIRST_LIST_WAIT)
    try {
      return await this.hub.call(params, options)
    } catch (e) {
      if (e instanceof Unreachable || e instanceof Refused) return failed(e.message)
      // The hub's own JSON-RPC errors (-32602 unknown tool, -32001 TabNotFound, ...) reach the host as
      // the hub sent them: the SDK's McpError has already put "MCP error <code>: " in front, and the
      // host's SDK puts it there again.
      if (e instanceof McpError) throw new HubRefusal(e)
      throw new McpError(ErrorCode.InternalError, describe(e))
    }
  }

  private async callBrowser(browser: BrowserLink, name: string, args: unknown, signal: AbortSignal): Promise<CallToolResult> {
    const tool = byName.get(name)
    if (tool === undefined) throw new McpError(ErrorCode.InvalidParams, `Unknown tool: ${name}`)
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
