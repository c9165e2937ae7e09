/**
 * The popup (also the options page): edits the server URL and token in `chrome.storage.local`
 * (the worker reconnects on the change), and shows the connection and the tabs that serve tools.
 */
import type { PopupState } from "./sw.ts"
import { Keys } from "./Keys.ts"

const element = <T extends HTMLElement>(id: string): T => {
  const el = document.getElementById(id)
  if (el === null) throw new Error(`popup.html lacks #${id}`)
  return el as T
}

const serverUrl = element<HTMLInputElement>("serverUrl")
const token = element<HTMLInputElement>("token")
const saved = element<HTMLSpanElement>("saved")
const stateBox = element<HTMLDivElement>("state")
const tabsBody = element<HTMLTableSectionElement>("tabs")

const load = async () => {
  const local = await chrome.storage.local.get([Keys.serverUrl, Keys.token])
  const policy: Record<string, unknown> = await chrome.storage.managed.get(null).catch(() => ({}))
  for (const [input, key] of [[serverUrl, Keys.serverUrl], [token, Keys.token]] as const) {
    const managed = policy[key]
    const value = typeof managed === "string" ? managed : local[key]
    input.value = typeof value === "string" ? value : ""
    // A policy's value cannot be changed here.
    input.disabled = typeof managed === "string"
  }
}

element<HTMLFormElement>("settings").addEventListener("submit", (event) => {
  event.preventDefault()
  void chrome.storage.local.set({ [Keys.serverUrl]: serverUrl.value.trim(), [Keys.token]: token.value.trim() }).then(() => {
    saved.textContent = " saved"
  })
})

const describe = (s: PopupState["proxy"]): string => {
  switch (s.state) {
    case "authenticated":
      return `Connected to ${s.server ?? "?"} as ${s.userId ?? "?"} (extension ${s.extensionId ?? "?"})`
    case "connecting":
      return `Connecting to ${s.server ?? "?"}…`
    case "disconnected":
      return `Disconnected from ${s.server ?? "?"}: ${s.reason ?? "unknown reason"}; retrying`
    case "unconfigured":
      return `Not configured: ${s.reason ?? "set the server URL and token"}`
  }
}

const render = (state: PopupState) => {
  stateBox.dataset["state"] = state.proxy.state
  stateBox.textContent = describe(state.proxy)
  tabsBody.replaceChildren(
    ...state.tabs.map((t) => {
      const row = document.createElement("tr")
      const tab = document.createElement("td")
      tab.textContent = `${t.title ?? t.url ?? `tab ${t.tabId}`}${t.connected ? "" : " (not relayed)"}`
      tab.title = t.url ?? ""
      const tools = document.createElement("td")
      tools.textContent = `${t.tools.length}: ${t.tools.join(", ")}`
      row.append(tab, tools)
      return row
    })
  )
  if (state.tabs.length === 0) {
    const row = document.createElement("tr")
    const cell = document.createElement("td")
    cell.colSpan = 2
    cell.textContent = "No open tab serves WebMCP tools."
    row.append(cell)
    tabsBody.append(row)
  }
}

const poll = async () => {
  const state: unknown = await chrome.runtime.sendMessage({ type: "state" }).catch(() => undefined)
  if (typeof state === "object" && state !== null) render(state as PopupState)
}

void load()
void poll()
setInterval(() => void poll(), 1000)
