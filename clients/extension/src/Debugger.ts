/**
 * Chrome DevTools Protocol through `chrome.debugger`: one attachment per tab, made on first use
 * and kept until the tab closes or the user detaches it, so screenshots and forwarded commands
 * don't show and hide the "is debugging this browser" bar on every call.
 */
import * as Cdp from "@switchboard/protocol/browser/Cdp"
import { type Json, MethodError } from "./Wire.ts"

const attached = new Set<number>()

chrome.debugger.onDetach.addListener((source) => {
  if (source.tabId !== undefined) attached.delete(source.tabId)
})
chrome.tabs.onRemoved.addListener((tabId) => attached.delete(tabId))

const messageOf = (e: unknown) => (e instanceof Error ? e.message : String(e))

const attach = async (tabId: number) => {
  if (attached.has(tabId)) return
  try {
    await chrome.debugger.attach({ tabId }, "1.3")
    attached.add(tabId)
  } catch (e) {
    const message = messageOf(e)
    if (/no tab with (given )?id/i.test(message)) throw new MethodError(`no tab ${tabId}`)
    if (/already attached/i.test(message)) {
      // Ours from before the service worker restarted (attachments outlive it), or someone else's.
      const ours = await chrome.debugger.sendCommand({ tabId }, "Runtime.evaluate", { expression: "1" }).then(() => true, () => false)
      if (ours) return void attached.add(tabId)
      throw new MethodError(`debugger already attached to tab ${tabId} (DevTools or another extension); close it and try again`)
    }
    if (/cannot (access|attach)/i.test(message)) throw new MethodError(`the debugger may not attach to tab ${tabId} (${message}); browser pages like chrome:// cannot be automated`)
    throw new MethodError(`could not attach the debugger to tab ${tabId}: ${message}`)
  }
}

/**
 * Sends one CDP command to the tab, or to a child target's session in it; a CDP error comes back
 * as its own message.
 */
export const send = async (tabId: number, method: string, params: Json = {}, sessionId?: string): Promise<Json> => {
  await attach(tabId)
  try {
    const answer = await chrome.debugger.sendCommand(sessionId === undefined ? { tabId } : { tabId, sessionId }, method, params)
    return (answer ?? {}) as Json
  } catch (e) {
    throw new MethodError(`${method} failed in tab ${tabId}: ${messageOf(e)}`)
  }
}

// --- tabs driven by a CDP client of the router (`/cdp/{extension_id}`) ------------------------

/** Which proxy connection drives each tab: its events go there, and no other client may take it. */
const driven = new Map<number, string>()
let sink: ((event: Cdp.EventParams) => void) | undefined

/** Where the events of driven tabs go (the proxy socket). */
export const onEvent = (to: (event: Cdp.EventParams) => void) => void (sink = to)

chrome.debugger.onEvent.addListener((source, method, params) => {
  const tabId = source.tabId
  const connection = tabId === undefined ? undefined : driven.get(tabId)
  if (tabId === undefined || connection === undefined) return
  sink?.({ connection_id: connection, tabId, ...(source.sessionId === undefined ? {} : { sessionId: source.sessionId }), method, ...(params === undefined ? {} : { params: params as Json }) })
})

/** The debugger left a driven tab (closed, or cancelled by the user): its client hears it as CDP says. */
const lost = (tabId: number, reason: string) => {
  const connection = driven.get(tabId)
  if (connection === undefined) return
  driven.delete(tabId)
  sink?.({ connection_id: connection, tabId, method: Cdp.Detached, params: { reason } })
}
chrome.debugger.onDetach.addListener((source, reason) => source.tabId === undefined || lost(source.tabId, reason))
chrome.tabs.onRemoved.addListener((tabId) => lost(tabId, "target_closed"))

/** Attaches the debugger to a tab for `connection`, unless another client drives it. */
export const drive = async (tabId: number, connection: string): Promise<Cdp.TargetInfo> => {
  const holder = driven.get(tabId)
  if (holder !== undefined && holder !== connection) throw new MethodError(`tab ${tabId} is driven by another CDP client`)
  await attach(tabId)
  driven.set(tabId, connection)
  const target = (await chrome.debugger.getTargets()).find((t) => t.tabId === tabId)
  const tab = await chrome.tabs.get(tabId)
  return {
    targetId: target?.id ?? String(tabId),
    type: "page",
    title: tab.title ?? "",
    // A tab still loading has no url yet; clients wait for a page target with one (Puppeteer does).
    url: tab.url || tab.pendingUrl || "about:blank",
    attached: true,
    canAccessOpener: false
  }
}

/** Lets a tab go: no more events to `connection`, and the debugger (with what the client set in it) detached. */
export const release = async (tabId: number, connection: string): Promise<void> => {
  if (driven.get(tabId) !== connection) return
  driven.delete(tabId)
  if (!attached.delete(tabId)) return
  await chrome.debugger.detach({ tabId }).catch(() => undefined)
}
