/**
 * The content script (top frame, isolated world): finds the page's MCP server and bridges it to
 * the service worker. Two ways to find one: `@mcp-b/global`'s tab transport (channel
 * `mcp-default`), and `document.modelContext` as our MAIN-world script serves it (its own channel).
 * The tab transport wins when both answer, since it is the page's full MCP server (annotations kept).
 * Nothing connects to the service worker until the page has a server, so plain pages cost nothing.
 */
import * as JsonRpc from "@switchboard/protocol/browser/JsonRpc"
import { PageClient } from "./PageClient.ts"
import { envelope, envelopeOf, fromOwnWindow, type Json, ModelContextChannel, PortName, type Progress, TabChannel, type ToPage } from "./Wire.ts"

/** How long a modelContext-only page waits for a tab transport to show up as well. */
const PREFER_TAB_TRANSPORT_MS = 300
const TOOLS_DEBOUNCE_MS = 50

let session: PageClient | undefined
let port: chrome.runtime.Port | undefined
let lastTools: ReadonlyArray<Json & { name: string }> | undefined
let fallback: ReturnType<typeof setTimeout> | undefined
let refresh: ReturnType<typeof setTimeout> | undefined

const toWorker = (message: object) => {
  if (port === undefined) connectPort()
  port?.postMessage(message)
}

/** The port to the service worker; a worker that was stopped is started again by reconnecting. */
const connectPort = () => {
  const p = chrome.runtime.connect({ name: PortName })
  port = p
  p.onMessage.addListener((message: unknown) => {
    if (!JsonRpc.isRecord(message)) return
    if (message["type"] === "execute") void execute(message as unknown as Extract<ToPage, { type: "execute" }>)
    if (message["type"] === "cancel") inflight.get(message["id"] as JsonRpc.Id)?.abort(message["reason"])
  })
  p.onDisconnect.addListener(() => {
    if (port !== p) return
    port = undefined
    // The worker was suspended or reloaded: say the tools again, so it reconnects this tab.
    if (lastTools !== undefined) setTimeout(() => lastTools !== undefined && toWorker({ type: "tools", tools: lastTools }), 100)
  })
}

/** Calls under way, by the registry's id, so that its cancellation reaches the page. */
const inflight = new Map<JsonRpc.Id, AbortController>()

const execute = async ({ args, id, progress, toolName }: Extract<ToPage, { type: "execute" }>) => {
  const current = session
  if (current === undefined) return toWorker({ type: "result", id, success: false, payload: "the page's MCP server is gone" })
  const abort = new AbortController()
  inflight.set(id, abort)
  try {
    const options = { signal: abort.signal, ...(progress ? { onProgress: (p: Progress) => toWorker({ type: "progress", id, ...p }) } : {}) }
    const payload = await current.callTool(toolName, args, options)
    if (!abort.signal.aborted) toWorker({ type: "result", id, success: true, payload })
  } catch (e) {
    // A cancelled call gets no answer: the registry has given up on it already (or the page answered on leaving).
    if (!abort.signal.aborted) toWorker({ type: "result", id, success: false, payload: e instanceof Error ? e.message : String(e) })
  } finally {
    inflight.delete(id)
  }
}

/**
 * A document that goes away takes its calls under way with it (a form submission or a link can
 * navigate mid-call): answer them now, while the port still works, rather than leave the client
 * waiting for a page that no longer exists.
 */
window.addEventListener("pagehide", () => {
  for (const [id, abort] of inflight) {
    toWorker({ type: "result", id, success: true, payload: { content: [{ type: "text", text: `The page ${location.href} went away (it navigated or was closed) before the tool answered. A new page's tools replace this page's.` }] } })
    abort.abort("the page navigated away")
  }
  inflight.clear()
})

const relayTools = async (client: PageClient) => {
  try {
    const tools = await client.listTools()
    if (session !== client) return
    lastTools = tools
    toWorker({ type: "tools", tools })
  } catch {
    // The page's server stopped answering; its next list_changed or ready starts over.
  }
}

const use = async (channel: string) => {
  session?.close()
  const client = new PageClient(channel, () => {
    if (refresh !== undefined) clearTimeout(refresh)
    refresh = setTimeout(() => void relayTools(client), TOOLS_DEBOUNCE_MS)
  })
  session = client
  try {
    await client.initialize()
  } catch {
    if (session === client) session = undefined
    return
  }
  if (session === client) await relayTools(client)
}

const onReady = (channel: string) => {
  if (session?.channel === TabChannel) return
  if (channel === TabChannel) {
    if (fallback !== undefined) clearTimeout(fallback)
    return void use(TabChannel)
  }
  if (session !== undefined || fallback !== undefined) return
  fallback = setTimeout(() => {
    fallback = undefined
    if (session === undefined) void use(ModelContextChannel)
  }, PREFER_TAB_TRANSPORT_MS)
}

window.addEventListener("message", (event) => {
  if (!fromOwnWindow(event)) return
  for (const channel of [TabChannel, ModelContextChannel]) {
    const payload = envelopeOf(event.data, channel, "server-to-client")?.payload
    if (payload === "mcp-server-ready") onReady(channel)
    if (payload === "mcp-server-stopped" && session?.channel === channel) {
      session.close()
      session = undefined
      // Its tools went with it.
      if (lastTools !== undefined && lastTools.length > 0) toWorker({ type: "tools", tools: [] })
      lastTools = undefined
    }
  }
})

/** Asks both kinds of server to announce themselves: on start, and as the page's scripts arrive. */
const checkReady = () => {
  for (const channel of [TabChannel, ModelContextChannel]) window.postMessage(envelope(channel, "client-to-server", "mcp-check-ready"), window.location.origin)
}
checkReady()
document.addEventListener("DOMContentLoaded", checkReady, { once: true })
window.addEventListener("load", checkReady, { once: true })
