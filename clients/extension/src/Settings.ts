/**
 * Where the extension's settings live: `chrome.storage.managed` (an enterprise policy) wins over
 * `chrome.storage.local` (the popup, or a test harness). The keys are documented in the README;
 * the service worker connects as soon as both the server URL and the token are set.
 */

import { Keys } from "./Keys.ts"

export { Keys }

export interface Settings {
  /** The Switchboard base URL (http(s):// or ws(s)://), without a path. */
  readonly serverUrl: string | undefined
  readonly token: string | undefined
  readonly name: string
}

const stringAt = (items: Record<string, unknown>, key: string): string | undefined => {
  const value = items[key]
  return typeof value === "string" && value.trim() !== "" ? value.trim() : undefined
}

const listeners = new Set<() => void>()
const notify = () => listeners.forEach((listener) => listener())

/**
 * The policy's settings. Chrome answers `storage.managed` only once it has loaded policies, which
 * takes seconds in a fresh profile; the local settings don't wait for that. A policy that arrives
 * late with settings of ours counts as a change. Managed storage throws where no policy applies.
 */
let policy: Record<string, unknown> | undefined
let policyLoading: Promise<void> | undefined
const POLICY_WAIT_MS = 250
const managed = (): Promise<Record<string, unknown>> => {
  if (policy !== undefined) return Promise.resolve(policy)
  let late = false
  policyLoading ??= chrome.storage.managed.get(null).then(
    (items) => {
      policy = items
      if (late && Object.values(Keys).some((k) => k in items)) notify()
    },
    () => void (policy = {})
  )
  return Promise.race([
    policyLoading.then(() => policy ?? {}),
    new Promise<Record<string, unknown>>((resolve) =>
      setTimeout(() => {
        late = true
        resolve({})
      }, POLICY_WAIT_MS)
    )
  ])
}

export const browserName = (): string => {
  const major = /Chrom(?:e|ium)\/(\d+)/.exec(navigator.userAgent)?.[1]
  return major === undefined ? "Chrome" : `Chrome ${major}`
}

export const read = async (): Promise<Settings> => {
  const [policy, local] = await Promise.all([managed(), chrome.storage.local.get(null)])
  const pick = (key: string) => stringAt(policy, key) ?? stringAt(local, key)
  return { serverUrl: pick(Keys.serverUrl), token: pick(Keys.token), name: pick(Keys.name) ?? browserName() }
}

/** The per-profile client id, created on first use. */
export const clientId = async (): Promise<string> => {
  const items = await chrome.storage.local.get(Keys.clientId)
  const existing = stringAt(items, Keys.clientId)
  if (existing !== undefined) return existing
  const fresh = crypto.randomUUID()
  await chrome.storage.local.set({ [Keys.clientId]: fresh })
  return fresh
}

/** The WebSocket URL of `path` on the server, or why the setting is unusable. */
export const socketUrl = (serverUrl: string, path: string): URL | string => {
  let url: URL
  try {
    url = new URL(serverUrl)
  } catch {
    return `the server URL ${JSON.stringify(serverUrl)} is not a URL`
  }
  const protocols: Record<string, string> = { "http:": "ws:", "https:": "wss:", "ws:": "ws:", "wss:": "wss:" }
  const protocol = protocols[url.protocol]
  if (protocol === undefined) return `the server URL must start with http(s):// or ws(s)://, not ${url.protocol}`
  url.protocol = protocol
  url.pathname = url.pathname.replace(/\/+$/, "") + path
  url.search = ""
  url.hash = ""
  return url
}

/** Calls `listener` whenever a setting the connections depend on changes. */
export const onChange = (listener: () => void): void => {
  listeners.add(listener)
}

const watched = new Set<string>([Keys.serverUrl, Keys.token, Keys.name])
chrome.storage.onChanged.addListener((changes, area) => {
  if (area !== "local" && area !== "managed") return
  if (area === "managed") {
    policy = undefined
    policyLoading = undefined
  }
  if (Object.keys(changes).some((k) => watched.has(k))) notify()
})
