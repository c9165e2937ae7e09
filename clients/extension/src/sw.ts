/**
 * The service worker: the proxy session on `/extension`, the MCP-B relay on `/tabs`, and what the
 * popup asks for. Both connect as soon as the settings are there and again whenever they change.
 */
import * as JsonRpc from "@switchboard/protocol/browser/JsonRpc"
import { ProxySession } from "./ProxySession.ts"
import * as Settings from "./Settings.ts"
import * as TabRelay from "./TabRelay.ts"

const KEEPALIVE = "switchboard-keepalive"

const proxy = new ProxySession()
TabRelay.start()

Settings.onChange(() => {
  void proxy.restart()
  TabRelay.reopenAll()
})

// The floor under the proxy's 20 s status: a suspended worker wakes, and reconnects if it must.
// Created only once: creating it again on every start would put its next firing off each time.
void chrome.alarms.get(KEEPALIVE).then(async (alarm) => {
  if (alarm === undefined) await chrome.alarms.create(KEEPALIVE, { periodInMinutes: 0.5 })
})
chrome.alarms.onAlarm.addListener((alarm) => {
  if (alarm.name === KEEPALIVE) void proxy.ensure()
})

export interface PopupState {
  readonly proxy: ProxySession["state"]
  readonly tabs: ReturnType<typeof TabRelay.state>
}

chrome.runtime.onMessage.addListener((message: unknown, sender, sendResponse) => {
  // Only the extension's own pages (the popup, or it opened as the options page in a tab) may ask;
  // a content script's sender is the web page it runs in.
  if (sender.id !== chrome.runtime.id || sender.url?.startsWith(chrome.runtime.getURL("")) !== true) return false
  if (JsonRpc.isRecord(message) && message["type"] === "state") {
    sendResponse({ proxy: proxy.state, tabs: TabRelay.state() } satisfies PopupState)
  }
  return false
})

void proxy.restart()
