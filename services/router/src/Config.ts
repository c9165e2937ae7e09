/** Every setting of the session router, read once. Defaults never get in the way of normal or benchmark traffic. */
import { Subjects } from "@switchboard/bus"
import { Settings } from "@switchboard/protocol"

export const requestTimeout = Settings.duration("ROUTER_REQUEST_TIMEOUT", "120 seconds", "How long a forwarded request waits for the extension's answer")
export const internalTimeout = Settings.duration(
  "ROUTER_INTERNAL_TIMEOUT",
  "10 seconds",
  "How long a request from another service (the registry's createTab) waits for the extension's answer"
)
export const authTimeout = Settings.duration(
  "ROUTER_AUTH_TIMEOUT",
  "10 seconds",
  "How long a new socket has to authenticate: an extension to answer authenticate, an MCP client to complete mcp_handshake"
)
export const statusInterval = Settings.duration("ROUTER_STATUS_INTERVAL", "20 seconds", "Period of the status keepalive (MV3 service workers idle after 30 s)")
export const maxPending = Settings.positiveInt("ROUTER_MAX_PENDING", 1_000, "Forwarded requests one MCP client may have in flight")
export const connectionRate = Settings.positiveNumber("ROUTER_CONNECTION_RATE", 20_000, "Forwarded requests per second per MCP client")
export const userRate = Settings.positiveNumber("ROUTER_USER_RATE", 50_000, "Forwarded requests per second per user, per router replica")
export const maxClientsPerUser = Settings.positiveInt(
  "ROUTER_MAX_CLIENTS_PER_USER",
  1_000,
  "Authenticated MCP clients one user may have at once, per router replica (counted in memory: the edge learns the user only in-band)"
)
export const maxExtensionsPerUser = Settings.positiveInt(
  "ROUTER_MAX_EXTENSIONS_PER_USER",
  100,
  "Authenticated browser extensions one user may have at once, per router replica (counted in memory: the edge learns the user only in-band)"
)
export const replicaHeartbeat = Settings.livenessInterval(
  "ROUTER_REPLICA_HEARTBEAT",
  "2 seconds",
  Subjects.Bucket.replicas.ttl,
  "Liveness period of a router replica; survivors adopt its sockets 3 periods after it stops"
)
export const shutdownGrace = Settings.duration(
  "ROUTER_SHUTDOWN_GRACE",
  "10 seconds",
  "How long a stopping router replica may take to hand its sockets to the other replicas (well under Kubernetes' 30 s)"
)
export const probeTimeout = Settings.duration(
  "ROUTER_PROBE_TIMEOUT",
  "5 seconds",
  "How long an MCP client's actor waits for its extension's actor to say whether their connection is still attached (asked after this replica's NATS connection came back, and after a forwarded request timed out); no answer in time is not taken as gone"
)
export const probeConcurrency = Settings.positiveInt(
  "ROUTER_PROBE_CONCURRENCY",
  64,
  "How many of those checks one router replica has in flight at once after its NATS connection came back, so that many sessions do not ask in one burst"
)
