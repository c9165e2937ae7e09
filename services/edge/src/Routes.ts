/**
 * Which WebSocket path goes to which service, and how each protocol authenticates. The edge
 * knows nothing else about the protocols.
 */
import type { Subjects } from "@switchboard/bus"

export interface Route {
  readonly service: Subjects.ServiceName
  /**
   * `upgrade`: a token (header or `?token=`) is required before the upgrade (401 without).
   * `optional`: a presented token is checked (401 if bad); without one, the protocol authenticates in-band.
   * `in-band`: the protocol authenticates after connect (close 1008 on failure).
   */
  readonly auth: "upgrade" | "optional" | "in-band"
  /** The WebSocket subprotocol the edge selects when the client offers it. */
  readonly subprotocol?: string
  /**
   * Whether a frame from this socket starts a trace. Passive peers (extensions) only answer, and
   * the service continues the request's own trace for their answers.
   */
  readonly traceInbound: boolean
}

export type RouteTable = Readonly<Record<string, Route>>

/**
 * The table's key for `path`: the path itself, or a prefix ending in "/" that serves every path
 * under it (`/cdp/` serves `/cdp/{extension_id}`). Frame limits are looked up by this key too.
 */
export const routeKey = (routes: RouteTable, path: string): string | undefined => {
  if (Object.hasOwn(routes, path)) return path.endsWith("/") ? undefined : path
  for (const key in routes) if (key.endsWith("/") && path.startsWith(key) && path.length > key.length) return key
  return undefined
}

/** The endpoints of DESIGN.md. */
export const standard: RouteTable = {
  "/extension": { service: "router", auth: "in-band", traceInbound: false },
  "/mcp": { service: "router", auth: "in-band", traceInbound: true },
  "/v0/ws": { service: "broker", auth: "upgrade", traceInbound: true },
  // Tabs mostly answer the hub's calls, whose traces the registry continues. A token at the
  // upgrade is still taken (older bridges); the extension authenticates in-band, keeping it out of URLs.
  "/tabs": { service: "registry", auth: "optional", traceInbound: false },
  "/hub": { service: "registry", auth: "optional", subprotocol: "mcp", traceInbound: true },
  // A user's browser as a CDP endpoint: `/cdp/{extension_id}`. CDP clients send the token as a
  // header (or `?token=`) and know no in-band handshake.
  "/cdp/": { service: "router", auth: "upgrade", traceInbound: true }
}

/** Plain HTTP paths (by prefix) that a service answers over the bus. */
export type HttpRouteTable = Readonly<Record<string, Subjects.ServiceName>>

export const standardHttp: HttpRouteTable = {
  "/admin/": "broker",
  "/v0/topics": "broker",
  // The CDP endpoint's discovery documents (`/cdp/{extension_id}/json/version`); the WebSocket
  // itself is an upgrade, which never reaches these.
  "/cdp/": "router"
}
