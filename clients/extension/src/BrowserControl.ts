/**
 * The extension's methods of the MCP Proxy Protocol: tabs, navigation, screenshots, clicks,
 * typing and raw CDP. Names and shapes follow the Blueprint MCP extension where it has them
 * (`createTab` → `{tab: {id, title, url}}`, `getTabs` → `{tabs}`, `selectTab` by `tabIndex`) and
 * the stdio bridge's (`tabId`, `selector`, `text`, `fullPage`, `browser_navigate`), so either works.
 */
import * as Cdp from "@switchboard/protocol/browser/Cdp"
import * as JsonRpc from "@switchboard/protocol/browser/JsonRpc"
import * as Debugger from "./Debugger.ts"
import { type Json, MethodError } from "./Wire.ts"

const LOAD_TIMEOUT = 30_000

/** The tab later commands without a `tabId` act on. */
let selected: number | undefined

const optionalInt = (params: Json, key: string): number | undefined => {
  const value = params[key]
  if (value === undefined || value === null) return undefined
  if (typeof value !== "number" || !Number.isInteger(value)) throw new MethodError(`${key} must be an integer`, JsonRpc.ErrorCode.InvalidParams)
  return value
}
const requiredString = (params: Json, key: string): string => {
  const value = params[key]
  if (typeof value !== "string" || value === "") throw new MethodError(`${key} is required and must be a non-empty string`, JsonRpc.ErrorCode.InvalidParams)
  return value
}

const tabById = (tabId: number): Promise<chrome.tabs.Tab> =>
  chrome.tabs.get(tabId).catch(() => {
    throw new MethodError(`no tab ${tabId}`)
  })

/** The tab named by `tabId`, else the selected one, else the active tab of the last focused window. */
const targetTab = async (params: Json): Promise<chrome.tabs.Tab> => {
  const tabId = optionalInt(params, "tabId")
  if (tabId !== undefined) return tabById(tabId)
  if (selected !== undefined) {
    const tab = await chrome.tabs.get(selected).catch(() => undefined)
    if (tab !== undefined) return tab
    selected = undefined
  }
  const [active] = await chrome.tabs.query({ active: true, lastFocusedWindow: true })
  if (active?.id === undefined) throw new MethodError("no tab is selected and no tab is active; pass tabId (see getTabs)")
  return active
}
const idOf = (tab: chrome.tabs.Tab): number => {
  if (tab.id === undefined) throw new MethodError("the tab has no id (a devtools window?)")
  return tab.id
}

const summary = (tab: chrome.tabs.Tab) => ({ id: tab.id, windowId: tab.windowId, index: tab.index, title: tab.title, url: tab.url, active: tab.active })

/**
 * Runs `start` and resolves with the tab once it has loaded. `fresh` means a load is known to be
 * under way (a new tab); otherwise only a load that begins after `start` counts, so an earlier
 * `complete` is not mistaken for this navigation's.
 */
const loaded = (tabId: number, start: () => Promise<unknown>, fresh = false): Promise<chrome.tabs.Tab> =>
  new Promise((resolve, reject) => {
    let began = fresh
    const stop = () => {
      clearTimeout(timer)
      chrome.tabs.onUpdated.removeListener(updated)
      chrome.tabs.onRemoved.removeListener(removed)
    }
    const timer = setTimeout(() => {
      stop()
      reject(new MethodError(`tab ${tabId} did not finish loading within ${LOAD_TIMEOUT / 1000} s`))
    }, LOAD_TIMEOUT)
    const updated = (id: number, info: chrome.tabs.OnUpdatedInfo, tab: chrome.tabs.Tab) => {
      if (id !== tabId) return
      if (info.status === "loading") began = true
      if (info.status === "complete" && began) {
        stop()
        resolve(tab)
      }
    }
    const removed = (id: number) => {
      if (id !== tabId) return
      stop()
      reject(new MethodError(`tab ${tabId} was closed while it loaded`))
    }
    chrome.tabs.onUpdated.addListener(updated)
    chrome.tabs.onRemoved.addListener(removed)
    start().then(
      async () => {
        // A new tab may have finished before the listener saw it.
        const now = fresh ? await chrome.tabs.get(tabId).catch(() => undefined) : undefined
        if (now?.status === "complete") {
          stop()
          resolve(now)
        }
      },
      (e: unknown) => {
        stop()
        reject(e instanceof MethodError ? e : new MethodError(`tab ${tabId}: ${e instanceof Error ? e.message : String(e)}`))
      }
    )
  })

const createTab = async (params: Json) => {
  const url = typeof params["url"] === "string" && params["url"] !== "" ? params["url"] : "about:blank"
  const tab = await chrome.tabs.create({ url, active: params["activate"] !== false }).catch((e: unknown) => {
    throw new MethodError(`could not open ${url}: ${e instanceof Error ? e.message : String(e)}`)
  })
  const tabId = idOf(tab)
  selected = tabId
  const done = url === "about:blank" ? tab : await loaded(tabId, () => Promise.resolve(), true)
  return { tabId, url: done.url ?? url, title: done.title, tab: summary(done) }
}

const getTabs = async () => {
  const tabs = await chrome.tabs.query({})
  return { tabs: tabs.map((t, index) => ({ ...summary(t), index, selected: t.id === selected })), selectedTabId: selected ?? null }
}

/** By `tabId`, or by `tabIndex` into getTabs' list as Blueprint's clients send it. */
const tabOfParams = async (params: Json): Promise<chrome.tabs.Tab> => {
  const tabId = optionalInt(params, "tabId")
  if (tabId !== undefined) return tabById(tabId)
  const index = optionalInt(params, "tabIndex") ?? optionalInt(params, "index")
  if (index === undefined) throw new MethodError("pass tabId (or tabIndex from getTabs)", JsonRpc.ErrorCode.InvalidParams)
  const tabs = await chrome.tabs.query({})
  const tab = tabs[index]
  if (tab === undefined) throw new MethodError(`no tab at index ${index}; there are ${tabs.length} (see getTabs)`)
  return tab
}

const activate = async (tab: chrome.tabs.Tab) => {
  const tabId = idOf(tab)
  await chrome.tabs.update(tabId, { active: true })
  await chrome.windows.update(tab.windowId, { focused: true }).catch(() => undefined)
}

const selectTab = async (params: Json) => {
  const tab = await tabOfParams(params)
  selected = idOf(tab)
  if (params["activate"] === true) await activate(tab)
  return { tabId: selected, tab: summary(tab) }
}

const activateTab = async (params: Json) => {
  const tab = await tabOfParams(params)
  selected = idOf(tab)
  await activate(tab)
  return { tabId: selected, tab: summary(await tabById(selected)) }
}

const closeTab = async (params: Json) => {
  const tab = params["tabId"] === undefined && params["tabIndex"] === undefined && params["index"] === undefined ? await targetTab(params) : await tabOfParams(params)
  const tabId = idOf(tab)
  await chrome.tabs.remove(tabId)
  if (selected === tabId) selected = undefined
  return { success: true, tabId }
}

const navigate = async (params: Json) => {
  const url = requiredString(params, "url")
  const tabId = idOf(await targetTab(params))
  const tab = await loaded(tabId, () => chrome.tabs.update(tabId, { url }))
  return { tabId, url: tab.url, title: tab.title }
}

interface NavigationHistory {
  readonly currentIndex: number
  readonly entries: ReadonlyArray<{ readonly id: number; readonly url: string }>
}

/**
 * Through CDP's history rather than `chrome.tabs.goBack`: Chrome's back button skips entries of
 * pages that were left without a user gesture, which is every page an agent drives, so
 * `tabs.goBack` finds no previous page where the history plainly has one.
 */
const history = (step: -1 | 1) => async (params: Json) => {
  const tabId = idOf(await targetTab(params))
  const { currentIndex, entries } = (await Debugger.send(tabId, "Page.getNavigationHistory")) as unknown as NavigationHistory
  const entry = entries[currentIndex + step]
  if (entry === undefined) throw new MethodError(`tab ${tabId} has no ${step < 0 ? "previous" : "next"} page`)
  const tab = await loaded(tabId, () => Debugger.send(tabId, "Page.navigateToHistoryEntry", { entryId: entry.id }))
  return { tabId, url: tab.url, title: tab.title }
}

interface Box {
  readonly width: number
  readonly height: number
}
interface LayoutMetrics {
  readonly cssContentSize?: Box
  readonly contentSize?: Box
  readonly cssVisualViewport?: Box & { readonly clientWidth: number; readonly clientHeight: number; readonly pageX: number; readonly pageY: number }
}

/**
 * PNG through CDP: it works on a background tab and beyond the viewport, unlike captureVisibleTab.
 * Always clipped to what the page calls its viewport (or its whole content): the surface Chrome
 * draws into can differ from it, e.g. under device emulation.
 */
const screenshot = async (params: Json) => {
  const tabId = idOf(await targetTab(params))
  const metrics = (await Debugger.send(tabId, "Page.getLayoutMetrics")) as LayoutMetrics
  const viewport = metrics.cssVisualViewport
  const content = metrics.cssContentSize ?? metrics.contentSize
  const clip =
    params["fullPage"] === true
      ? content === undefined ? undefined : { x: 0, y: 0, width: content.width, height: content.height }
      : viewport === undefined ? undefined : { x: viewport.pageX, y: viewport.pageY, width: viewport.clientWidth, height: viewport.clientHeight }
  if (clip === undefined) throw new MethodError(`tab ${tabId} reported no layout metrics to take a screenshot by`)
  const { data } = await Debugger.send(tabId, "Page.captureScreenshot", {
    format: "png",
    captureBeyondViewport: true,
    clip: { x: clip.x, y: clip.y, width: Math.ceil(clip.width), height: Math.ceil(clip.height), scale: 1 }
  })
  if (typeof data !== "string") throw new MethodError(`tab ${tabId} returned no image`)
  return { data, mimeType: "image/png", tabId }
}

/** Runs `func` in the tab's page (isolated world) and returns what it returned. */
const inPage = async <Args extends Array<string | boolean>, R>(tabId: number, func: (...args: Args) => R, args: Args): Promise<R> => {
  const [frame] = await chrome.scripting.executeScript({ target: { tabId }, func, args }).catch((e: unknown) => {
    throw new MethodError(`could not run in tab ${tabId}: ${e instanceof Error ? e.message : String(e)}`)
  })
  return frame?.result as R
}

type Found =
  | { readonly ok: true; readonly tag: string; readonly value?: string; readonly x?: number; readonly y?: number }
  | { readonly ok: false; readonly why: string }

// Each of the functions below runs on its own in the page (chrome.scripting serialises it), so
// each finds its element itself rather than through a shared helper.

/** Runs in the page: clicks the first element `selector` finds. */
const clickIn = (selector: string): Found => {
  let el: Element | null
  try {
    el = document.querySelector(selector)
  } catch {
    return { ok: false, why: `${JSON.stringify(selector)} is not a valid CSS selector` }
  }
  if (el === null) return { ok: false, why: `no element matches ${JSON.stringify(selector)}` }
  el.scrollIntoView({ block: "center", inline: "center" })
  if (el instanceof HTMLElement) el.click()
  else el.dispatchEvent(new MouseEvent("click", { bubbles: true, cancelable: true, view: window }))
  return { ok: true, tag: el.tagName.toLowerCase() }
}

/** Runs in the page: types `text` at the end of the first input, textarea or editable `selector` finds. */
const typeIn = (selector: string, text: string, clear: boolean): Found => {
  let el: Element | null
  try {
    el = document.querySelector(selector)
  } catch {
    return { ok: false, why: `${JSON.stringify(selector)} is not a valid CSS selector` }
  }
  if (el === null) return { ok: false, why: `no element matches ${JSON.stringify(selector)}` }
  if (!(el instanceof HTMLElement)) return { ok: false, why: `${JSON.stringify(selector)} is not an HTML element` }
  el.focus()
  if (el instanceof HTMLInputElement || el instanceof HTMLTextAreaElement) {
    // The prototype's setter, so frameworks that wrap `value` (React) see the change.
    const proto = el instanceof HTMLInputElement ? HTMLInputElement.prototype : HTMLTextAreaElement.prototype
    const next = (clear ? "" : el.value) + text
    Object.getOwnPropertyDescriptor(proto, "value")?.set?.call(el, next)
    el.dispatchEvent(new InputEvent("input", { bubbles: true, data: text, inputType: "insertText" }))
    el.dispatchEvent(new Event("change", { bubbles: true }))
    return { ok: true, tag: el.tagName.toLowerCase(), value: el.value }
  }
  if (el.isContentEditable) {
    if (clear) el.textContent = ""
    document.execCommand("insertText", false, text)
    return { ok: true, tag: el.tagName.toLowerCase(), value: el.textContent ?? "" }
  }
  return { ok: false, why: `${JSON.stringify(selector)} is a <${el.tagName.toLowerCase()}>, which takes no text` }
}

/** Runs in the page: scrolls the first element `selector` finds into view; where its centre is, in CSS pixels of the viewport. */
const centreIn = (selector: string): Found => {
  let el: Element | null
  try {
    el = document.querySelector(selector)
  } catch {
    return { ok: false, why: `${JSON.stringify(selector)} is not a valid CSS selector` }
  }
  if (el === null) return { ok: false, why: `no element matches ${JSON.stringify(selector)}` }
  el.scrollIntoView({ block: "center", inline: "center" })
  const box = el.getBoundingClientRect()
  return { ok: true, tag: el.tagName.toLowerCase(), x: box.left + box.width / 2, y: box.top + box.height / 2 }
}

const found = (tabId: number, answer: Found | undefined) => {
  if (answer === undefined) throw new MethodError(`tab ${tabId} gave no answer (is it still loading?)`)
  if (!answer.ok) throw new MethodError(`${answer.why} in tab ${tabId}`)
  return { ...answer, tabId }
}

const click = async (params: Json) => {
  const selector = requiredString(params, "selector")
  const tabId = idOf(await targetTab(params))
  const { ok: _ok, ...rest } = found(tabId, await inPage(tabId, clickIn, [selector]))
  return { clicked: true, ...rest }
}

const type = async (params: Json) => {
  const selector = requiredString(params, "selector")
  const text = typeof params["text"] === "string" ? params["text"] : ""
  const tabId = idOf(await targetTab(params))
  const { ok: _ok, ...rest } = found(tabId, await inPage(tabId, typeIn, [selector, text, params["clear"] === true]))
  return { typed: true, ...rest }
}

/** A real mouse move through CDP, so `:hover` styles apply and the page sees trusted mouse events. */
const hover = async (params: Json) => {
  const selector = requiredString(params, "selector")
  const tabId = idOf(await targetTab(params))
  const { ok: _ok, x, y, ...rest } = found(tabId, await inPage(tabId, centreIn, [selector]))
  await Debugger.send(tabId, "Input.dispatchMouseEvent", { type: "mouseMoved", x: x ?? 0, y: y ?? 0 })
  return { hovered: true, ...rest }
}

const forwardCDPCommand = async (params: Json) => {
  const method = requiredString(params, "method")
  const tabId = idOf(await targetTab(params))
  const cdpParams = params["params"]
  const sessionId = params["sessionId"]
  if (sessionId !== undefined && typeof sessionId !== "string") throw new MethodError("sessionId must be a string", JsonRpc.ErrorCode.InvalidParams)
  return Debugger.send(tabId, method, JsonRpc.isRecord(cdpParams) ? cdpParams : {}, sessionId)
}

/** A tab for a CDP client of the router (`Cdp.Method.attach`); `tabId` and `connection_id` are required. */
const cdpAttach = async (params: Json) => Debugger.drive(idOf(await tabOfParams(params)), requiredString(params, "connection_id"))
const cdpDetach = async (params: Json) => {
  const tabId = optionalInt(params, "tabId")
  if (tabId === undefined) throw new MethodError("tabId is required", JsonRpc.ErrorCode.InvalidParams)
  await Debugger.release(tabId, requiredString(params, "connection_id"))
  return {}
}

const methods: Readonly<Record<string, (params: Json) => Promise<unknown>>> = {
  createTab,
  getTabs,
  selectTab,
  activateTab,
  closeTab,
  navigate,
  browser_navigate: navigate,
  goBack: history(-1),
  goForward: history(1),
  screenshot,
  click,
  type,
  hover,
  forwardCDPCommand,
  [Cdp.Method.attach]: cdpAttach,
  [Cdp.Method.detach]: cdpDetach
}

export const handle = (method: string, params: Json): Promise<unknown> => {
  const run = Object.hasOwn(methods, method) ? methods[method] : undefined
  if (run === undefined) return Promise.reject(new MethodError(`Method not found: ${method} (this extension serves ${Object.keys(methods).join(", ")})`, JsonRpc.ErrorCode.MethodNotFound))
  return run(params)
}
