/**
 * Runs in the page's own JavaScript world (MAIN), where `document.modelContext` (WebMCP, or its
 * deprecated alias `navigator.modelContext`) lives. It serves that API as a small MCP server on our
 * own envelope channel, so the content script can use one client for both kinds of page. It
 * answers only requests the page's own window posts from its own origin, and posts only to it.
 */
import * as JsonRpc from "@switchboard/protocol/browser/JsonRpc"
import { envelope, envelopeOf, fromOwnWindow, type Json, ModelContextChannel } from "./Wire.ts"

/**
 * The parts of the WebMCP API this uses. Two builds differ in `executeTool`'s input: Chrome's
 * native API (Chromium 156) takes the arguments as an object and refuses a string with a
 * TypeError; `@mcp-b/webmcp-polyfill` 5.1.0 takes a JSON string and refuses an object with
 * "Failed to parse input arguments". Both refuse before the tool runs.
 */
interface RegisteredTool {
  readonly name: string
  readonly title?: string
  readonly description?: string
  readonly inputSchema?: Json
  readonly annotations?: Json
}
interface ModelContext extends EventTarget {
  getTools(): Promise<ReadonlyArray<RegisteredTool>>
  executeTool(tool: RegisteredTool, input: Json | string): Promise<unknown>
}

const modelContext = (): ModelContext | undefined => {
  const candidate: unknown = Reflect.get(document, "modelContext") ?? Reflect.get(navigator, "modelContext")
  return candidate instanceof EventTarget && typeof Reflect.get(candidate, "getTools") === "function" ? (candidate as ModelContext) : undefined
}

/** Which input a page's `modelContext` took, once a call got past the input check. */
const inputShapes = new WeakMap<ModelContext, "object" | "json">()

/** The refusal of an input of the wrong shape, as each build words it: nothing ran. */
const refusedInput = (e: unknown): boolean =>
  e instanceof TypeError || (e instanceof DOMException && /parse input arguments/i.test(e.message))

/**
 * Calls `tool` with `args` in the shape this page's `modelContext` takes. Unknown pages get the
 * object (the standard's shape) first, and the JSON string only when the object was refused as
 * input, so a tool never runs twice. A tool's own failure arrives wrapped as an `UnknownError`
 * in both builds, never as such a refusal.
 */
const executeTool = async (mc: ModelContext, tool: RegisteredTool, args: Json): Promise<unknown> => {
  const known = inputShapes.get(mc)
  if (known === "json") return mc.executeTool(tool, JSON.stringify(args))
  let refusal: unknown
  try {
    const output = await mc.executeTool(tool, args)
    inputShapes.set(mc, "object")
    return output
  } catch (e) {
    if (known === "object" || !refusedInput(e)) throw e
    refusal = e
  }
  try {
    const output = await mc.executeTool(tool, JSON.stringify(args))
    inputShapes.set(mc, "json")
    return output
  } catch (e) {
    // Refused in both shapes: the first refusal says what was wrong, the second only that a string is no object.
    throw refusedInput(e) ? refusal : e
  }
}

/**
 * Where the document is going, and when it started to: a declarative form that navigates
 * (submitted with no `respondWith`) resolves `executeTool` with `null`, which says nothing to
 * the client on its own. The Navigation API names the destination.
 */
let leaving: { readonly url: string; readonly at: number } | undefined
const navigation: unknown = Reflect.get(window, "navigation")
if (navigation instanceof EventTarget) {
  navigation.addEventListener("navigate", (event) => {
    const url: unknown = Reflect.get(Reflect.get(event, "destination") ?? {}, "url")
    if (typeof url === "string") leaving = { url, at: performance.now() }
  })
}

/** The answer to a call that got no value because the page navigated. */
const navigated = (since: number): Json => ({
  content: [{
    type: "text",
    text: leaving !== undefined && leaving.at >= since
      ? `The form was submitted and the page navigated to ${leaving.url}; it gave no other answer. The new page's tools replace this page's.`
      : "The tool gave no answer: the page navigated away. The new page's tools replace this page's."
  }]
})

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
      if (JsonRpc.isRecord(parsed) && Array.isArray(parsed["content"])) return parsed
    } catch {
      // plain text
    }
    return { content: [{ type: "text", text: output }] }
  }
  return JsonRpc.isRecord(output) && Array.isArray(output["content"]) ? output : { content: [{ type: "text", text: JSON.stringify(output ?? null) }] }
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
          inputSchema: JsonRpc.isRecord(t.inputSchema) ? t.inputSchema : { type: "object", properties: {} },
          ...(JsonRpc.isRecord(t.annotations) ? { annotations: t.annotations } : {})
        }))
      }
    case "tools/call": {
      const name = params["name"]
      const tool = (await mc.getTools()).find((t) => t.name === name)
      if (tool === undefined) return { isError: true, content: [{ type: "text", text: `Tool not found: ${String(name)}` }] }
      try {
        const since = performance.now()
        const output = await executeTool(mc, tool, JsonRpc.isRecord(params["arguments"]) ? params["arguments"] : {})
        // Chrome answers with a string always, except for a form whose submission navigated.
        return output === null || output === undefined ? navigated(since) : callResult(output)
      } catch (e) {
        return { isError: true, content: [{ type: "text", text: e instanceof Error ? e.message : String(e) }] }
      }
    }
    default:
      throw Object.assign(new Error(`Method not found: ${method}`), { code: JsonRpc.ErrorCode.MethodNotFound })
  }
}

window.addEventListener("message", (event) => {
  if (!fromOwnWindow(event)) return
  const payload = envelopeOf(event.data, ModelContextChannel, "client-to-server")?.payload
  if (payload === undefined) return
  const mc = modelContext()
  if (mc === undefined) return // no WebMCP on this page (yet): stay silent
  if (payload === "mcp-check-ready") return post("mcp-server-ready")
  if (!JsonRpc.isRecord(payload) || typeof payload["method"] !== "string") return
  const id = payload["id"]
  if (typeof id !== "string" && typeof id !== "number") return // notifications/initialized needs nothing
  handle(mc, payload["method"], JsonRpc.isRecord(payload["params"]) ? payload["params"] : {}).then(
    (result) => post({ jsonrpc: "2.0", id, result }),
    (e: unknown) => post(JsonRpc.errorResponse(id, JsonRpc.isRecord(e) && typeof e["code"] === "number" ? e["code"] : JsonRpc.ErrorCode.InternalError, e instanceof Error ? e.message : String(e)))
  )
})
