/**
 * Every subject, header, KV bucket and KV key name Switchboard uses, built by typed functions.
 * Services never write these strings inline. Subjects here are relative: the bus adapter puts them
 * under its namespace (default `sb`), so `router.open` travels as `sb.router.open`.
 */
import * as Brand from "effect/Brand"

export type ConnId = string & Brand.Brand<"ConnId">
export const ConnId = Brand.nominal<ConnId>()
export type EdgeId = string & Brand.Brand<"EdgeId">
export const EdgeId = Brand.nominal<EdgeId>()

/** The services that host connection actors behind the edge. `echo` exists for benchmarks. */
export type ServiceName = "router" | "broker" | "registry" | "echo"

/** Header names of the envelope between edge and services (DESIGN.md, "Envelope"). */
export const Header = {
  conn: "sb-conn",
  conns: "sb-conns",
  edge: "sb-edge",
  op: "sb-op",
  user: "sb-user",
  code: "sb-code",
  reason: "sb-reason",
  traceparent: "traceparent",
  tracestate: "tracestate"
} as const

/**
 * `open` and `closed` are lifecycle events from the edge, `frame` is a client frame, `deliver`
 * and `close` are instructions to the edge.
 */
export type Op = "open" | "frame" | "closed" | "deliver" | "close"

/** A connection's open event: a request to the service's queue group, answered once its actor listens. */
export const open = (service: ServiceName): string => `${service}.open`
/** Frames and lifecycle of one connection, consumed by the actor that owns it. */
export const conn = (service: ServiceName, connId: ConnId): string => `${service}.conn.${connId}`
/** Everything for the sockets of one edge process: deliveries and close instructions. */
export const edgeOut = (edgeId: EdgeId): string => `edge.${edgeId}.out`
/** Token verification (request/reply, queue group `auth`). */
export const authVerify = "auth.verify"

export const Queue = {
  auth: "auth",
  service: (service: ServiceName): string => service
} as const

/** KV buckets. The adapter namespaces bucket names as it does subjects. */
export const Bucket = {
  /** edge id → heartbeat; expires when an edge dies. */
  edges: "edges",
  /** conn id → the actor record of a connection (service, edge, user). */
  connections: "connections"
} as const

/** KV keys use `.` as a token separator, so a prefix is a subject-style filter (`a.b.>`). */
export const Key = {
  edge: (edgeId: EdgeId): string => edgeId,
  connection: (connId: ConnId): string => connId
} as const

/** NATS subject tokens and KV key tokens may not contain `.`, `*`, `>` or whitespace. */
export const isToken = (s: string): boolean => s.length > 0 && /^[A-Za-z0-9_\-=]+$/.test(s)
