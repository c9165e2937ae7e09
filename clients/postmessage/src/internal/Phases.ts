/** The two phases of the spec: which message starts each handshake, and which one answers it. */
import * as Messages from "../Messages.ts"

export type Phase = "setup" | "transport"

export const handshakeType = (phase: Phase) => phase === "setup" ? "MCP_SETUP_HANDSHAKE" : "MCP_TRANSPORT_HANDSHAKE"
export const replyType = (phase: Phase) => phase === "setup" ? "MCP_SETUP_HANDSHAKE_REPLY" : "MCP_TRANSPORT_HANDSHAKE_REPLY"

/** The base URL (transport phase) or the base URL with `#setup` (setup phase). */
export const phaseUrl = (serverUrl: string, phase: Phase): string => {
  const url = new URL(serverUrl)
  url.hash = phase === "setup" ? "setup" : ""
  return url.href
}

/** Whether this page was loaded for the setup phase: its URL's hash is `#setup` (or starts `#setup&`). */
export const isSetupPhase = (location: Pick<Location, "hash"> = window.location): boolean =>
  new URLSearchParams(location.hash.replace(/^#/, "")).has("setup")

export const DEFAULT_HANDSHAKE_TIMEOUT_MS = 10_000

/**
 * How often the inner frame repeats its handshake until it is answered (within the handshake
 * timeout): an outer frame may start listening only after the frame's `load` event, after a
 * first announcement made while the page loaded (the reference implementation's outer frame does).
 */
export const DEFAULT_ANNOUNCE_EVERY_MS = 250

/** The version check both sides make; undefined when it passes. */
export const versionProblem = (version: string): string | undefined =>
  version === Messages.PROTOCOL_VERSION
    ? undefined
    : `the peer speaks postMessage transport ${version}; this side speaks ${Messages.PROTOCOL_VERSION}`

/** The versions this side speaks, newest first. */
const SPOKEN: ReadonlyArray<string> = [Messages.PROTOCOL_VERSION]

/** `"1.10"` after `"1.9"`: versions are compared as dotted numbers, not as strings. */
const compareVersions = (x: string, y: string): number => {
  const [a, b] = [x.split(".").map(Number), y.split(".").map(Number)]
  for (let i = 0; i < Math.max(a.length, b.length); i++) {
    const d = (a[i] ?? 0) - (b[i] ?? 0)
    if (d !== 0) return d
  }
  return 0
}

/**
 * The version to answer a setup handshake with: the one it names, or the newest this side speaks
 * within the range it offers (the reference's later form). Either the version or a problem to
 * refuse the handshake with.
 */
export const negotiate = (handshake: Messages.SetupHandshake | Messages.TransportHandshake): { readonly version: string } | { readonly problem: string } => {
  const { protocolVersion } = handshake
  if (handshake.type === "MCP_SETUP_HANDSHAKE" && handshake.minProtocolVersion !== undefined && handshake.maxProtocolVersion !== undefined) {
    const [min, max] = [handshake.minProtocolVersion, handshake.maxProtocolVersion]
    const common = SPOKEN.find((v) => compareVersions(v, min) >= 0 && compareVersions(v, max) <= 0)
    if (common !== undefined) return { version: common }
    // A single version named beside the range is still worth a try.
    if (protocolVersion === undefined) {
      return { problem: `the peer speaks postMessage transport ${min} to ${max}; this side speaks ${SPOKEN.join(", ")}` }
    }
  }
  if (protocolVersion === undefined) return { problem: "the handshake names no postMessage transport version" }
  const problem = versionProblem(protocolVersion)
  return problem === undefined ? { version: protocolVersion } : { problem }
}
