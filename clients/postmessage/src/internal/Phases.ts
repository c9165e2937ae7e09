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
