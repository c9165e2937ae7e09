/** Every setting of the edge, read once. Defaults never get in the way of normal or benchmark traffic. */
import * as Config from "effect/Config"

export const port = Config.integer("PORT").pipe(
  Config.validate({ message: "PORT must be 0 (any free port) to 65535", validation: (p) => p >= 0 && p <= 65535 }),
  Config.withDescription("HTTP/WebSocket port; 0 picks a free one"),
  Config.withDefault(8080)
)
export const host = Config.string("HOST").pipe(Config.withDescription("Address to bind"), Config.withDefault("127.0.0.1"))
export const allowedOrigins = Config.string("ALLOWED_ORIGINS").pipe(
  Config.withDescription("Comma-separated allowed Origin values for upgrades; * accepts any (and warns)"),
  Config.withDefault("*"),
  Config.map((s) => s.split(",").map((o) => o.trim()).filter((o) => o.length > 0))
)
export const maxPayload = Config.integer("EDGE_MAX_PAYLOAD").pipe(
  Config.withDescription("Largest accepted frame in bytes; larger closes with 1009"),
  Config.withDefault(1024 * 1024)
)
export const pingInterval = Config.duration("EDGE_PING_INTERVAL").pipe(
  Config.withDescription("Ping every socket this often; one without a pong by the next ping is terminated"),
  Config.withDefault("30 seconds")
)
export const outboundHighWaterMark = Config.integer("EDGE_OUTBOUND_HWM").pipe(
  Config.withDescription("Bytes buffered towards one socket before it is closed with 1013 as a slow consumer"),
  Config.withDefault(8 * 1024 * 1024)
)
export const rateLimit = Config.number("EDGE_RATE_LIMIT").pipe(
  Config.withDescription("Frames per second per connection before frames are marked rate-limited"),
  Config.withDefault(50_000)
)
export const rateBurst = Config.number("EDGE_RATE_BURST").pipe(
  Config.withDescription("Burst allowance per connection, in frames"),
  Config.withDefault(100_000)
)
export const openTimeout = Config.duration("EDGE_OPEN_TIMEOUT").pipe(
  Config.withDescription("How long a new socket waits for its service to take it"),
  Config.withDefault("5 seconds")
)
export const heartbeatInterval = Config.duration("EDGE_HEARTBEAT_INTERVAL").pipe(
  Config.withDescription("How often the edge renews its liveness key in KV (the key lives 3 intervals)"),
  Config.withDefault("5 seconds")
)
export const shutdownGrace = Config.duration("EDGE_SHUTDOWN_GRACE").pipe(
  Config.withDescription("How long sockets get to close on shutdown before they are terminated"),
  Config.withDefault("5 seconds")
)
export const edgeId = Config.option(
  Config.string("EDGE_ID").pipe(Config.withDescription("This edge's id on the bus; random when unset"))
)
export const maxConnectionsPerAddress = Config.integer("EDGE_MAX_CONNECTIONS_PER_ADDRESS").pipe(
  Config.validate({ message: "EDGE_MAX_CONNECTIONS_PER_ADDRESS must be 0 (no limit) or more", validation: (n) => n >= 0 }),
  Config.withDescription(
    "Open sockets (and upgrades in progress) from one remote address before upgrades are refused with 429; 0 is no limit. " +
      "Behind a proxy that hides client addresses every socket has the proxy's, so set 0 there"
  ),
  Config.withDefault(1024)
)
export const maxConnectionsPerUser = Config.integer("EDGE_MAX_CONNECTIONS_PER_USER").pipe(
  Config.validate({ message: "EDGE_MAX_CONNECTIONS_PER_USER must be 0 (no limit) or more", validation: (n) => n >= 0 }),
  Config.withDescription("Open sockets whose upgrade carried a valid token, per token subject, before upgrades are refused with 429; 0 is no limit"),
  Config.withDefault(256)
)
export const headersTimeout = Config.duration("EDGE_HEADERS_TIMEOUT").pipe(
  Config.withDescription("How long a client has to send a request's headers (upgrades included) before the socket is closed"),
  Config.withDefault("10 seconds")
)
export const requestTimeout = Config.duration("EDGE_REQUEST_TIMEOUT").pipe(
  Config.withDescription("How long a client has to send a whole HTTP request, body included; at least EDGE_HEADERS_TIMEOUT"),
  Config.withDefault("30 seconds")
)
