/** Every setting of the session router, read once. Defaults never get in the way of normal or benchmark traffic. */
import * as Config from "effect/Config"

export const requestTimeout = Config.duration("ROUTER_REQUEST_TIMEOUT").pipe(
  Config.withDescription("How long a forwarded request waits for the extension's answer"),
  Config.withDefault("120 seconds")
)
export const internalTimeout = Config.duration("ROUTER_INTERNAL_TIMEOUT").pipe(
  Config.withDescription("How long a request from another service (the registry's createTab) waits for the extension's answer"),
  Config.withDefault("10 seconds")
)
export const authTimeout = Config.duration("ROUTER_AUTH_TIMEOUT").pipe(
  Config.withDescription("How long a new socket has to authenticate: an extension to answer authenticate, an MCP client to complete mcp_handshake"),
  Config.withDefault("10 seconds")
)
export const statusInterval = Config.duration("ROUTER_STATUS_INTERVAL").pipe(
  Config.withDescription("Period of the status keepalive (MV3 service workers idle after 30 s)"),
  Config.withDefault("20 seconds")
)
export const maxPending = Config.integer("ROUTER_MAX_PENDING").pipe(
  Config.withDescription("Forwarded requests one MCP client may have in flight"),
  Config.withDefault(1_000)
)
export const connectionRate = Config.number("ROUTER_CONNECTION_RATE").pipe(
  Config.withDescription("Forwarded requests per second per MCP client"),
  Config.withDefault(20_000)
)
export const userRate = Config.number("ROUTER_USER_RATE").pipe(
  Config.withDescription("Forwarded requests per second per user, per router replica"),
  Config.withDefault(50_000)
)
export const maxClientsPerUser = Config.integer("ROUTER_MAX_CLIENTS_PER_USER").pipe(
  Config.withDescription("Authenticated MCP clients one user may have at once, per router replica (counted in memory: the edge learns the user only in-band)"),
  Config.withDefault(1_000)
)
export const maxExtensionsPerUser = Config.integer("ROUTER_MAX_EXTENSIONS_PER_USER").pipe(
  Config.withDescription("Authenticated browser extensions one user may have at once, per router replica (counted in memory: the edge learns the user only in-band)"),
  Config.withDefault(100)
)
export const replicaHeartbeat = Config.duration("ROUTER_REPLICA_HEARTBEAT").pipe(
  Config.withDescription("Liveness period of a router replica; survivors adopt its sockets 3 periods after it stops"),
  Config.withDefault("2 seconds")
)
