/**
 * Which browsers and which names may reach this edge: the `Origin` a page sends and the `Host` a
 * request names, one rule for upgrades and plain HTTP alike. A page of a foreign origin must not
 * drive a user's sessions, and a DNS name rebound to a loopback address must not reach a local edge
 * (the MCP specification's DNS rebinding warning); pure, so each rule is tested on its own.
 */
import * as Option from "effect/Option"

/** Why a request is refused: its status (400 malformed, 403 not allowed) and a message that says why. */
export interface Refusal {
  readonly status: 400 | 403
  readonly message: string
}

/** A `Host` header's parts, lowercased; `hostname` keeps an IPv6 literal's brackets, as URLs do. */
export interface HostParts {
  readonly hostname: string
  readonly port: string | undefined
}

/**
 * RFC 9110 §7.2: `uri-host [ ":" port ]`, where `uri-host` is an IP-literal or a reg-name
 * (unreserved, pct-encoded and sub-delims characters; an IPv4 address is one too). Anything else
 * (a `"`, a space, a `/`) is no host, and must never reach a header or a document we write.
 */
const HOST = /^(\[[0-9a-f:.]+\]|\[v[0-9a-f]+\.[a-z0-9\-._~!$&'()*+,;=:]+\]|(?:[a-z0-9\-._~!$&'()*+,;=]|%[0-9a-f]{2})+)(?::([0-9]{0,5}))?$/i

/** Longer than any DNS name (253) with a port: such a header is no host anyone reaches. */
const MAX_HOST_LENGTH = 300

/** The parts of a well-formed `Host`, or undefined. */
export const parseHost = (host: string | undefined): HostParts | undefined => {
  if (host === undefined || host.length > MAX_HOST_LENGTH) return undefined
  const m = HOST.exec(host)
  if (m === null || m[1] === undefined) return undefined
  const port = m[2] === undefined || m[2] === "" ? undefined : m[2]
  if (port !== undefined && Number(port) > 65535) return undefined
  return { hostname: m[1].toLowerCase(), port }
}

/** The names a loopback client uses, as the MCP SDK's `localhostAllowedHostnames`. */
const LOOPBACK_NAMES: ReadonlySet<string> = new Set(["localhost", "127.0.0.1", "[::1]"])

export const isLoopbackName = (hostname: string) => LOOPBACK_NAMES.has(hostname.toLowerCase())

/** Whether a bind address (`HOST`) listens on loopback only: then only this machine can connect. */
export const isLoopbackAddress = (address: string) => {
  const a = address.trim().toLowerCase().replace(/^\[(.*)\]$/, "$1")
  return a === "localhost" || a === "::1" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(a)
}

/** Schemes of browser extensions' pages: an extension is installed by its user, never a web page. */
const EXTENSION_SCHEMES: ReadonlySet<string> = new Set(["chrome-extension", "moz-extension", "safari-web-extension"])

/** `scheme://host[:port]`, what a browser sends as `Origin` (never a path, never a trailing `/`). */
const ORIGIN = /^([a-z][a-z0-9+.-]*):\/\/([^/?#\s]+)$/i

/** Whether `text` is an origin as `ALLOWED_ORIGINS` takes it; the reason when it is not. */
export const originError = (text: string): string | undefined => {
  if (text === "*") return undefined
  if (ORIGIN.test(text)) return undefined
  if (/^[a-z][a-z0-9+.-]*:\/\/[^/?#\s]+\/+$/i.test(text)) return `${JSON.stringify(text)} has a trailing /; an origin is scheme://host[:port]`
  return `${JSON.stringify(text)} is not an origin (scheme://host[:port]) or *`
}

export interface OriginPolicyOptions {
  /** `ALLOWED_ORIGINS`: none is the default rule (extensions and loopback pages); `*` is any. */
  readonly allowedOrigins: Option.Option<ReadonlyArray<string>>
  /** `HOST`, the address the edge binds. */
  readonly bindAddress: string
  /** `EDGE_PUBLIC_URL`, the base URL clients reach this edge at. */
  readonly publicUrl: Option.Option<string>
}

export interface OriginPolicy {
  /** Whether any origin is allowed (`*`), which the edge warns about at start. */
  readonly anyOrigin: boolean
  /** One line for the start log: which origins and hosts are accepted. */
  readonly summary: string
  /** A browser's `Origin`; undefined (no header) is no browser's, and accepted. */
  readonly checkOrigin: (origin: string | undefined) => Refusal | undefined
  /**
   * A request's `Host`. A probe (`/healthz`, `/readyz`, `/metrics`) needs a well-formed one only:
   * kubelets and Prometheus name a pod by its address, and those paths hold nothing of a user's.
   */
  readonly checkHost: (host: string | undefined, probe: boolean) => Refusal | undefined
  /** This edge's base URL as the client reached it, without a trailing `/`: from `EDGE_PUBLIC_URL`, or a well-formed `Host`. */
  readonly baseUrl: (host: string | undefined) => string
}

export const make = (options: OriginPolicyOptions): OriginPolicy => {
  const listed = Option.getOrElse(options.allowedOrigins, () => [] as ReadonlyArray<string>)
  const byDefault = listed.length === 0
  const anyOrigin = listed.includes("*")
  const allowed: ReadonlySet<string> = new Set(listed.map((o) => o.toLowerCase()))
  const publicUrl = Option.flatMap(options.publicUrl, (text) => {
    try {
      return Option.some(new URL(text))
    } catch {
      return Option.none()
    }
  })
  const publicOrigin = Option.map(publicUrl, (u) => u.origin.toLowerCase())
  const publicName = Option.map(publicUrl, (u) => u.hostname.toLowerCase())
  const loopback = isLoopbackAddress(options.bindAddress)
  /** Names a request must use; undefined: any well-formed one (a public bind, no EDGE_PUBLIC_URL). */
  const names: ReadonlySet<string> | undefined = Option.isSome(publicName)
    ? new Set([publicName.value, ...(loopback ? LOOPBACK_NAMES : [])])
    : loopback
    ? LOOPBACK_NAMES
    : undefined

  /** The default rule: extensions' pages, pages served from loopback, and this edge's own public origin. */
  const allowedByDefault = (origin: string) => {
    const m = ORIGIN.exec(origin)
    if (m === null || m[1] === undefined || m[2] === undefined) return false
    const scheme = m[1].toLowerCase()
    if (EXTENSION_SCHEMES.has(scheme)) return true
    if (Option.isSome(publicOrigin) && origin.toLowerCase() === publicOrigin.value) return true
    const host = parseHost(m[2])
    return (scheme === "http" || scheme === "https") && host !== undefined && isLoopbackName(host.hostname)
  }

  const checkOrigin = (origin: string | undefined): Refusal | undefined => {
    if (origin === undefined || anyOrigin) return undefined
    if (byDefault) {
      return allowedByDefault(origin)
        ? undefined
        : { status: 403, message: `origin ${origin} is not allowed (without ALLOWED_ORIGINS only browser extensions and loopback pages are)` }
    }
    return allowed.has(origin.toLowerCase()) ? undefined : { status: 403, message: `origin ${origin} is not allowed` }
  }

  const expected = [...(names ?? [])].join(", ")
  /**
   * The last Host checked, and what it said: nearly every request names the same one, and a parse
   * (a match, a lowercased copy, its parts) was a hundredth of what each handshake allocated.
   */
  let last: { readonly host: string; readonly probe: boolean; readonly refusal: Refusal | undefined } | undefined
  const checkHost = (host: string | undefined, probe: boolean): Refusal | undefined => {
    if (host !== undefined && last !== undefined && last.host === host && last.probe === probe) return last.refusal
    const refusal = checkHostOnce(host, probe)
    if (host !== undefined) last = { host, probe, refusal }
    return refusal
  }
  const checkHostOnce = (host: string | undefined, probe: boolean): Refusal | undefined => {
    if (host === undefined) {
      return names === undefined || probe ? undefined : { status: 400, message: "a Host header is required" }
    }
    // Never echoed: a malformed Host may be made to look like anything in a log or a message.
    const parts = parseHost(host)
    if (parts === undefined) return { status: 400, message: "malformed Host header" }
    if (names === undefined || probe || names.has(parts.hostname)) return undefined
    return {
      status: 403,
      message: Option.isSome(publicName)
        ? `Host ${host} is not allowed: this edge serves ${expected} (EDGE_PUBLIC_URL)`
        : `Host ${host} is not allowed: this edge listens on loopback, so a request must name ${expected} ` +
          "(a DNS name that resolves to it could be a rebinding attack); set EDGE_PUBLIC_URL to serve a name"
    }
  }

  const baseUrl = (host: string | undefined) =>
    Option.match(publicUrl, {
      onSome: (u) => `${u.origin}${u.pathname}`.replace(/\/+$/, ""),
      onNone: () => `http://${host !== undefined && parseHost(host) !== undefined ? host : "localhost"}`
    })

  const summary = `origins: ${anyOrigin ? "any (*)" : byDefault ? "none but browser extensions' and loopback pages'" : listed.join(", ")}` +
    `${byDefault && Option.isSome(publicOrigin) ? ` and ${publicOrigin.value}` : ""}; hosts: ${names === undefined ? "any" : expected}`

  return { anyOrigin, summary, checkOrigin, checkHost, baseUrl }
}

/** A value as an RFC 9110 quoted-string: `"` and `\` escaped, so it cannot close the string early. */
export const quoted = (value: string) => `"${value.replace(/[\\"]/g, "\\$&")}"`
