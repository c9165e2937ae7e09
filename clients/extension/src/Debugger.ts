/**
 * Chrome DevTools Protocol through `chrome.debugger`: one attachment per tab, made on first use
 * and kept until the tab closes or the user detaches it, so screenshots and forwarded commands
 * don't show and hide the "is debugging this browser" bar on every call.
 */
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

/** Sends one CDP command to the tab; a CDP error comes back as its own message. */
export const send = async (tabId: number, method: string, params: Json = {}): Promise<Json> => {
  await attach(tabId)
  try {
    const answer = await chrome.debugger.sendCommand({ tabId }, method, params)
    return (answer ?? {}) as Json
  } catch (e) {
    throw new MethodError(`${method} failed in tab ${tabId}: ${messageOf(e)}`)
  }
}
