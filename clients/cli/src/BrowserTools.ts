/**
 * The browser_* MCP tools and the extension methods they call through the MCP Proxy Protocol.
 * Method names follow the spec's table of forwarded methods (so navigation is `browser_navigate`,
 * not `navigate`); the spec names no parameters beyond `createTab {url}`, so the ones here are
 * ours: `url`, `tabId`, `selector`, `text`, `fullPage`, and `method`/`params` for CDP.
 */
import type { CallToolResult, Tool } from "@modelcontextprotocol/server"
import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"

export interface BrowserTool {
  readonly tool: Tool
  /** The extension method it forwards. */
  readonly method: string
  /** The host's arguments as the extension's params, or why they are not acceptable. */
  readonly params: (args: unknown) => Either.Either<Record<string, unknown>, string>
  readonly answer: (result: unknown) => CallToolResult
}

const url = { type: "string", description: "An absolute URL, e.g. https://example.com" }
const tabId = { type: "integer", description: "The tab's id, as browser_get_tabs lists it" }
const optionalTab = { type: "integer", description: "The tab's id, as browser_get_tabs lists it; default: the selected tab" }
const selector = { type: "string", description: "A CSS selector" }

const json = (result: unknown): CallToolResult => ({ content: [{ type: "text", text: JSON.stringify(result ?? {}, null, 2) }] })

/** Decodes the host's arguments with `schema` and drops the fields it left out. */
const paramsOf = <A extends Record<string, unknown>, I>(name: string, schema: Schema.Schema<A, I>) => {
  const decode = Schema.decodeUnknownEither(schema, { onExcessProperty: "error" })
  return (args: unknown) =>
    decode(args ?? {}).pipe(
      Either.map((a) => Object.fromEntries(Object.entries(a).filter(([, v]) => v !== undefined))),
      Either.mapLeft((e) => `${name}: invalid arguments: ${ParseResult.TreeFormatter.formatErrorSync(e)}`)
    )
}

const define = <A extends Record<string, unknown>, I>(
  name: string,
  method: string,
  description: string,
  schema: Schema.Schema<A, I>,
  properties: NonNullable<Tool["inputSchema"]["properties"]>,
  required: ReadonlyArray<string>,
  extra: { readonly readOnly?: boolean; readonly destructive?: boolean; readonly answer?: (result: unknown) => CallToolResult } = {}
): BrowserTool => ({
  tool: {
    name,
    description,
    inputSchema: { type: "object", properties, ...(required.length === 0 ? {} : { required: [...required] }), additionalProperties: false },
    annotations: {
      readOnlyHint: extra.readOnly === true,
      destructiveHint: extra.destructive === true,
      openWorldHint: true
    }
  },
  method,
  params: paramsOf(name, schema),
  answer: extra.answer ?? json
})

const Int = Schema.Int
const Selector = Schema.String

export interface Image {
  readonly data: string
  readonly mimeType: string
}

const DATA_URL = /^data:([^;,]+)(?:;[^,]*)?;base64,(.*)$/s

const fromDataUrl = (s: string): Image | undefined => {
  const m = DATA_URL.exec(s)
  return m === null || m[1] === undefined || m[2] === undefined ? undefined : { mimeType: m[1], data: m[2] }
}

const isRecord = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && !Array.isArray(u)

/**
 * The image in a screenshot answer. Extensions answer `{data, mimeType}` (base64; PNG when no
 * type is given), `{screenshot: "data:image/png;base64,…"}`, or the data URL itself.
 */
export const imageOf = (answer: unknown): Image | undefined => {
  if (typeof answer === "string") return fromDataUrl(answer)
  if (!isRecord(answer)) return undefined
  for (const key of ["screenshot", "dataUrl", "image"]) {
    const value = answer[key]
    if (typeof value === "string") return fromDataUrl(value)
    if (isRecord(value)) return imageOf(value)
  }
  const data = answer["data"]
  if (typeof data !== "string" || data === "") return undefined
  const mimeType = answer["mimeType"] ?? answer["mime_type"] ?? answer["format"]
  return (
    fromDataUrl(data) ?? {
      data,
      mimeType: typeof mimeType === "string" ? (mimeType.includes("/") ? mimeType : `image/${mimeType}`) : "image/png"
    }
  )
}

const screenshotAnswer = (result: unknown): CallToolResult => {
  const image = imageOf(result)
  return image === undefined
    ? { isError: true, content: [{ type: "text", text: "The extension's screenshot answer held no image (expected {data, mimeType} or a data: URL)" }] }
    : { content: [{ type: "image", data: image.data, mimeType: image.mimeType }] }
}

export const browserTools: ReadonlyArray<BrowserTool> = [
  define("browser_create_tab", "createTab", "Open a new browser tab at a URL.", Schema.Struct({ url: Schema.String }), { url }, ["url"]),
  define("browser_get_tabs", "getTabs", "List the open browser tabs (id, URL, title).", Schema.Struct({}), {}, [], { readOnly: true }),
  define("browser_select_tab", "selectTab", "Make a tab the selected one; later commands without tabId act on it.", Schema.Struct({ tabId: Int }), { tabId }, ["tabId"]),
  define("browser_close_tab", "closeTab", "Close a browser tab.", Schema.Struct({ tabId: Int }), { tabId }, ["tabId"], { destructive: true }),
  define(
    "browser_navigate",
    "browser_navigate",
    "Navigate a tab (default: the selected one) to a URL.",
    Schema.Struct({ url: Schema.String, tabId: Schema.optional(Int) }),
    { url, tabId: optionalTab },
    ["url"]
  ),
  define("browser_go_back", "goBack", "Go back in a tab's history.", Schema.Struct({ tabId: Schema.optional(Int) }), { tabId: optionalTab }, []),
  define("browser_go_forward", "goForward", "Go forward in a tab's history.", Schema.Struct({ tabId: Schema.optional(Int) }), { tabId: optionalTab }, []),
  define(
    "browser_screenshot",
    "screenshot",
    "Take a screenshot of a tab (default: the selected one) and return it as an image.",
    Schema.Struct({ tabId: Schema.optional(Int), fullPage: Schema.optional(Schema.Boolean) }),
    { tabId: optionalTab, fullPage: { type: "boolean", description: "The whole page rather than the viewport" } },
    [],
    { readOnly: true, answer: screenshotAnswer }
  ),
  define("browser_click", "click", "Click the element a CSS selector finds in the selected tab.", Schema.Struct({ selector: Selector }), { selector }, ["selector"]),
  define(
    "browser_type",
    "type",
    "Type text into the element a CSS selector finds in the selected tab.",
    Schema.Struct({ selector: Selector, text: Schema.String }),
    { selector, text: { type: "string", description: "The text to type" } },
    ["selector", "text"]
  ),
  define("browser_hover", "hover", "Move the mouse over the element a CSS selector finds in the selected tab.", Schema.Struct({ selector: Selector }), { selector }, ["selector"]),
  define(
    "browser_cdp",
    "forwardCDPCommand",
    "Send a Chrome DevTools Protocol command to a tab (default: the selected one), e.g. Runtime.evaluate.",
    Schema.Struct({ method: Schema.String, params: Schema.optional(Schema.Record({ key: Schema.String, value: Schema.Unknown })), tabId: Schema.optional(Int) }),
    {
      method: { type: "string", description: "A CDP method, e.g. Runtime.evaluate" },
      params: { type: "object", description: "The method's parameters", additionalProperties: true },
      tabId: optionalTab
    },
    ["method"]
  )
]

export const byName: ReadonlyMap<string, BrowserTool> = new Map(browserTools.map((t) => [t.tool.name, t]))
