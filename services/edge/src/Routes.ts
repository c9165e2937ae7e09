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

/** The endpoints of DESIGN.md. */
export const standard: RouteTable = {
  "/extension": { service: "router", auth: "in-band", traceInbound: false },
  "/mcp": { service: "router", auth: "in-band", traceInbound: true },
  "/v0/ws": { service: "broker", auth: "upgrade", traceInbound: true },
  // Tabs mostly answer the hub's calls, whose traces the registry continues. A token at the
  // upgrade is still taken (older bridges); the extension authenticates in-band, keeping it out of URLs.
  "/tabs": { service: "registry", auth: "optional", traceInbound: false },
  "/hub": { service: "registry", auth: "optional", subprotocol: "mcp", traceInbound: true }
}

/** Plain HTTP paths (by prefix) that a service answers over the bus. */
export type HttpRouteTable = Readonly<Record<string, Subjects.ServiceName>>

export const standardHttp: HttpRouteTable = {
  "/admin/": "broker",
  "/v0/topics": "broker"
}
