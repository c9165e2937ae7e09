/**
 * Runs in the page's own JavaScript world (MAIN), where `document.modelContext` (WebMCP, or its
 * deprecated alias `navigator.modelContext`) lives. It serves that API as a small MCP server on our
 * own envelope channel, so the content script can use one client for both kinds of page. It
 * answers only requests the page's own window posts from its own origin, and posts only to it.
 */
import { envelope, envelopeOf, fromOwnWindow, isRecord, type Json, ModelContextChannel } from "./Wire.ts"

/** The parts of the WebMCP API this uses (the draft of 2026-05, as `@mcp-b/webmcp-polyfill` has it). */
interface RegisteredTool {
  readonly name: string
  readonly title?: string
  readonly description?: string
  readonly inputSchema?: Json
  readonly annotations?: Json
}
interface ModelContext extends EventTarget {
  getTools(): Promise<ReadonlyArray<RegisteredTool>>
  executeTool(tool: RegisteredTool, input: string): Promise<unknown>
}

const modelContext = (): ModelContext | undefined => {
  const candidate: unknown = Reflect.get(document, "modelContext") ?? Reflect.get(navigator, "modelContext")
  return candidate instanceof EventTarget && typeof Reflect.get(candidate, "getTools") === "function" ? (candidate as ModelContext) : undefined
}

const post = (payload: unknown) => window.postMessage(envelope(ModelContextChannel, "server-to-client", payload), window.location.origin)

let watching: ModelContext | undefined
const watch = (mc: ModelContext) => {
  if (watching === mc) return
  watching = mc
  mc.addEventListener("toolchange", () => post({ jsonrpc: "2.0", method: "notifications/tools/list_changed" }))
}

/** A tool's answer as an MCP CallToolResult: WebMCP serialises what `execute` returned. */
const callResult = (output: unknown): Json => {
  if (typeof output === "string") {
    try {
      const parsed: unknown = JSON.parse(output)
      if (isRecord(parsed) && Array.isArray(parsed["content"])) return parsed
    } catch {
      // plain text
    }
    return { content: [{ type: "text", text: output }] }
  }
  return isRecord(output) && Array.isArray(output["content"]) ? output : { content: [{ type: "text", text: JSON.stringify(output ?? null) }] }
}

const handle = async (mc: ModelContext, method: string, params: Json): Promise<Json> => {
  switch (method) {
    case "initialize":
      watch(mc)
      return {
        protocolVersion: typeof params["protocolVersion"] === "string" ? params["protocolVersion"] : "2025-06-18",
        capabilities: { tools: { listChanged: true } },
        serverInfo: { name: `${location.hostname}-modelcontext`, version: "1.0.0" }
      }
    case "tools/list":
      return {
        tools: (await mc.getTools()).map((t) => ({
          name: t.name,
          ...(t.title ? { title: t.title } : {}),
          ...(t.description === undefined ? {} : { description: t.description }),
          inputSchema: isRecord(t.inputSchema) ? t.inputSchema : { type: "object", properties: {} },
          ...(isRecord(t.annotations) ? { annotations: t.annotations } : {})
        }))
      }
    case "tools/call": {
      const name = params["name"]
      const tool = (await mc.getTools()).find((t) => t.name === name)
      if (tool === undefined) return { isError: true, content: [{ type: "text", text: `Tool not found: ${String(name)}` }] }
      try {
        return callResult(await mc.executeTool(tool, JSON.stringify(isRecord(params["arguments"]) ? params["arguments"] : {})))
      } catch (e) {
        return { isError: true, content: [{ type: "text", text: e instanceof Error ? e.message : String(e) }] }
      }
    }
    default:
      throw Object.assign(new Error(`Method not found: ${method}`), { code: -32601 })
  }
}

window.addEventListener("message", (event) => {
  if (!fromOwnWindow(event)) return
  const payload = envelopeOf(event.data, ModelContextChannel, "client-to-server")?.payload
  if (payload === undefined) return
  const mc = modelContext()
  if (mc === undefined) return // no WebMCP on this page (yet): stay silent
  if (payload === "mcp-check-ready") return post("mcp-server-ready")
  if (!isRecord(payload) || typeof payload["method"] !== "string") return
  const id = payload["id"]
  if (typeof id !== "string" && typeof id !== "number") return // notifications/initialized needs nothing
  handle(mc, payload["method"], isRecord(payload["params"]) ? payload["params"] : {}).then(
    (result) => post({ jsonrpc: "2.0", id, result }),
    (e: unknown) => post({ jsonrpc: "2.0", id, error: { code: isRecord(e) && typeof e["code"] === "number" ? e["code"] : -32603, message: e instanceof Error ? e.message : String(e) } })
  )
})
