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

/**
 * What a socket's open keeps of its target: the path, and the query the open event carries, which
 * leaves the token out (the last value of a name wins). Taken at once, so that the `URL` and its
 * parsed query do not wait through the token check and the service's answer (issue 29).
 */
export interface SocketTarget {
  readonly path: string
  readonly query: Readonly<Record<string, string>>
}

export const socketTarget = (url: URL): SocketTarget => {
  const query: Record<string, string> = {}
  for (const [k, v] of url.searchParams) if (k !== "token") query[k] = v
  return { path: url.pathname, query }
}

/** Query names whose values are credentials, compared lowercased after decoding. */
const CREDENTIALS: ReadonlySet<string> = new Set(["token", "access_token"])

/** A query parameter's name as `URLSearchParams` (and so the upgrade) reads it: `%74oken` is `token`. */
const decodedName = (raw: string) => new URLSearchParams(`${raw}=`).keys().next().value ?? raw

/**
 * A request target as logs may show it: a `token` in the query is a credential, and its value is
 * left out. Names are compared decoded, as the server reads them, so no spelling of `token` the
 * server takes (`%74oken`, `t%6Fken`) is logged; the rest of the target is left as it came.
 */
export const loggable = (target: string | undefined) => {
  const raw = target ?? ""
  const q = raw.indexOf("?")
  if (q < 0) return raw
  const hash = raw.indexOf("#", q)
  const end = hash < 0 ? raw.length : hash
  const query = raw.slice(q + 1, end).split("&").map((pair) => {
    const eq = pair.indexOf("=")
    const name = eq < 0 ? pair : pair.slice(0, eq)
    return CREDENTIALS.has(decodedName(name).toLowerCase()) ? `${name}=…` : pair
  })
  return `${raw.slice(0, q + 1)}${query.join("&")}${raw.slice(end)}`
}

/** The bearer token of an `Authorization` header, if it has one. */
export const headerToken = (req: Http.IncomingMessage): string | undefined => {
  const header = req.headers.authorization
  if (header === undefined) return undefined
  return /^Bearer\s+(.+)$/i.exec(header.trim())?.[1]
}

/**
 * Why a token is refused before anyone verifies it, or undefined: one far longer than any real JWT
 * would otherwise cost a verification and a cache entry per request.
 */
export const tokenTooLong = (token: string, maxBytes: number): string | undefined => {
  // UTF-8 takes at most three bytes per UTF-16 unit: most tokens are judged without counting.
  if (token.length <= maxBytes / 3) return undefined
  const bytes = Buffer.byteLength(token)
  return bytes > maxBytes ? `token too long: ${bytes} bytes, at most ${maxBytes}` : undefined
}

/** What a log line says about the request an error happened in. */
export const requestLog = (req: Http.IncomingMessage) => ({
  method: req.method ?? "",
  url: loggable(req.url),
  remote: req.socket.remoteAddress ?? "unknown"
})
