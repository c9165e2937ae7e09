/**
 * What the upgrade and the HTTP routes both read from a request: its target, parsed once and never
 * trusted, and how a log line names it without leaking a token.
 */
import type * as Http from "node:http"

/**
 * Targets without a query, parsed once each: a handful of paths (`/hub`) take nearly every
 * request, and `new URL` cost 6% of the server's CPU at 1×1 over Streamable HTTP. Shared, so never
 * changed; bounded, since any peer can send any path.
 */
const plainTargets = new Map<string, URL | undefined>()

/**
 * A request's target as a URL, or undefined when it is not one (`//`, `http://[::1`): any peer
 * can send any target, and `new URL` throws on those.
 */
export const targetOf = (req: Http.IncomingMessage): URL | undefined => {
  const raw = req.url ?? "/"
  const plain = raw.length <= 256 && !raw.includes("?")
  if (plain && plainTargets.has(raw)) return plainTargets.get(raw)
  let url: URL | undefined
  try {
    url = new URL(raw, "http://edge")
  } catch {
    url = undefined
  }
  if (plain) {
    if (plainTargets.size >= 1024) plainTargets.clear()
    plainTargets.set(raw, url)
  }
  return url
}

/** A request target as logs may show it: a `token` in the query is a credential, and is left out. */
export const loggable = (target: string | undefined) => (target ?? "").replace(/([?&]token=)[^&#]*/gi, "$1…")

/** What a log line says about the request an error happened in. */
export const requestLog = (req: Http.IncomingMessage) => ({
  method: req.method ?? "",
  url: loggable(req.url),
  remote: req.socket.remoteAddress ?? "unknown"
})
