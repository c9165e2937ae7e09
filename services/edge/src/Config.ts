/** Every setting of the edge, read once. Defaults never get in the way of normal or benchmark traffic. */
import * as Config from "effect/Config"
import * as ConfigError from "effect/ConfigError"
import * as Either from "effect/Either"

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
  Config.withDescription("Largest accepted frame in bytes on paths EDGE_MAX_PAYLOAD_PATHS does not name; larger closes with 1009"),
  Config.withDefault(1024 * 1024)
)
/**
 * Browsers answer with page content (a full-page screenshot is 1.5 MiB and more), so the paths
 * of browser peers take larger frames than the paths of MCP clients.
 */
export const maxPayloadByPath = Config.string("EDGE_MAX_PAYLOAD_PATHS").pipe(
  Config.withDescription("Per-path frame limits in bytes, as path=bytes pairs separated by commas; other paths use EDGE_MAX_PAYLOAD"),
  Config.withDefault("/extension=16777216,/tabs=16777216"),
  Config.mapOrFail((text) => {
    const limits = new Map<string, number>()
    for (const pair of text.split(",").map((p) => p.trim()).filter((p) => p.length > 0)) {
      const at = pair.lastIndexOf("=")
      const bytes = Number(pair.slice(at + 1))
      if (at <= 0 || !pair.startsWith("/") || !Number.isSafeInteger(bytes) || bytes <= 0) {
        return Either.left(ConfigError.InvalidData(["EDGE_MAX_PAYLOAD_PATHS"], `expected /path=bytes pairs with bytes > 0, got ${JSON.stringify(pair)}`))
      }
      limits.set(pair.slice(0, at), bytes)
    }
    return Either.right(limits as ReadonlyMap<string, number>)
  })
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
export const httpMaxBody = Config.integer("EDGE_HTTP_MAX_BODY").pipe(
  Config.validate({ message: "EDGE_HTTP_MAX_BODY must be more than 0", validation: (n) => n > 0 }),
  Config.withDescription("Largest Streamable HTTP request body at /hub in bytes; larger gets 413"),
  Config.withDefault(4 * 1024 * 1024)
)
export const httpKeepAlive = Config.duration("EDGE_HTTP_KEEPALIVE").pipe(
  Config.withDescription("An SSE comment goes down every open Streamable HTTP stream this often, so proxies don't cut idle streams"),
  Config.withDefault("15 seconds")
)
export const httpResponseTimeout = Config.duration("EDGE_HTTP_RESPONSE_TIMEOUT").pipe(
  Config.withDescription("How long a Streamable HTTP request waits for its session's next message before it is answered 504 (or its SSE stream ends)"),
  Config.withDefault("5 minutes")
)
export const httpSessionCache = Config.duration("EDGE_HTTP_SESSION_CACHE").pipe(
  Config.withDescription("How long an edge trusts that a Streamable HTTP session it looked up in KV still exists, before it looks again"),
  Config.withDefault("2 seconds")
)
export const publicUrl = Config.option(
  Config.string("EDGE_PUBLIC_URL").pipe(
    Config.withDescription("This edge's base URL as clients reach it (https://mcp.example.com), for OAuth metadata; from the Host header when unset")
  )
)
