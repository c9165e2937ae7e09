/** Every setting of the edge, read once. Defaults never get in the way of normal or benchmark traffic. */
import { Subjects } from "@switchboard/bus"
import { Settings } from "@switchboard/protocol"
import * as Config from "effect/Config"
import * as ConfigError from "effect/ConfigError"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import { originError } from "./OriginPolicy.ts"

export const port = Settings.intBetween("PORT", 0, 65535, 8080, "HTTP/WebSocket port; 0 picks a free one")
export const host = Config.string("HOST").pipe(Config.withDescription("Address to bind"), Config.withDefault("127.0.0.1"))
/**
 * Unset, the edge takes browsers' extensions and pages served from loopback, and no other web page:
 * the MCP specification requires servers to check `Origin`, and a wildcard default let any site a
 * user visits drive their sessions.
 */
export const allowedOrigins = Config.option(
  Config.string("ALLOWED_ORIGINS").pipe(
    Config.withDescription(
      "Comma-separated Origins browsers may connect from (upgrades and /hub); * accepts any (and warns). " +
        "Unset: browser extensions and loopback pages only. Requests without Origin are always accepted"
    ),
    Config.mapOrFail((text) => {
      const origins = text.split(",").map((o) => o.trim()).filter((o) => o.length > 0)
      for (const origin of origins) {
        const error = originError(origin)
        if (error !== undefined) return Either.left(ConfigError.InvalidData([], `ALLOWED_ORIGINS: ${error}`))
      }
      return Either.right(origins as ReadonlyArray<string>)
    })
  )
).pipe(Config.map(Option.filter((origins) => origins.length > 0)))
export const embedAllowedOrigins = Config.string("EMBED_ALLOWED_ORIGINS").pipe(
  Config.withDescription("Comma-separated origins of the web apps that may embed /embed; none by default (embedding is opt-in)"),
  Config.withDefault(""),
  Config.map((s) => s.split(",").map((o) => o.trim()).filter((o) => o.length > 0))
)
export const embedScript = Config.option(
  Config.string("EMBED_SCRIPT").pipe(
    Config.withDescription("The built script of the /embed page; by default clients/postmessage/dist/embed.js (npm run build)")
  )
)
export const maxPayload = Settings.positiveInt(
  "EDGE_MAX_PAYLOAD",
  1024 * 1024,
  "Largest accepted frame in bytes on paths EDGE_MAX_PAYLOAD_PATHS does not name; larger closes with 1009"
)
/**
 * Browsers answer with page content (a full-page screenshot is 1.5 MiB and more), so the paths
 * of browser peers take larger frames than the paths of MCP clients.
 */
export const maxPayloadByPath = Config.string("EDGE_MAX_PAYLOAD_PATHS").pipe(
  Config.withDescription("Per-path frame limits in bytes, as path=bytes pairs separated by commas; other paths use EDGE_MAX_PAYLOAD"),
  Config.withDefault("/extension=16777216,/tabs=16777216,/cdp/=16777216"),
  Config.mapOrFail((text) => {
    const limits = new Map<string, number>()
    for (const pair of text.split(",").map((p) => p.trim()).filter((p) => p.length > 0)) {
      const at = pair.lastIndexOf("=")
      const bytes = Number(pair.slice(at + 1))
      if (at <= 0 || !pair.startsWith("/") || !Number.isSafeInteger(bytes) || bytes <= 0) {
        return Either.left(ConfigError.InvalidData([], `EDGE_MAX_PAYLOAD_PATHS must be /path=bytes pairs with bytes > 0, got ${JSON.stringify(pair)}`))
      }
      limits.set(pair.slice(0, at), bytes)
    }
    return Either.right(limits as ReadonlyMap<string, number>)
  })
)
export const pingInterval = Settings.duration("EDGE_PING_INTERVAL", "30 seconds", "Ping every socket this often; one without a pong by the next ping is terminated")
export const outboundHighWaterMark = Settings.positiveInt(
  "EDGE_OUTBOUND_HWM",
  8 * 1024 * 1024,
  "Bytes buffered towards one socket before it is closed with 1013 as a slow consumer, or towards one Streamable HTTP response before it is cut"
)
export const rateLimit = Settings.positiveNumber("EDGE_RATE_LIMIT", 50_000, "Frames per second per connection before frames are marked rate-limited")
export const rateBurst = Settings.atLeast("EDGE_RATE_BURST", 100_000, "Burst allowance per connection, in frames", rateLimit, "EDGE_RATE_LIMIT")
export const openTimeout = Settings.duration("EDGE_OPEN_TIMEOUT", "5 seconds", "How long a new socket waits for its service to take it")
export const heartbeatInterval = Settings.livenessInterval(
  "EDGE_HEARTBEAT_INTERVAL",
  "5 seconds",
  Subjects.Bucket.edges.ttl,
  "How often the edge renews its liveness key in KV"
)
export const shutdownGrace = Settings.nonNegativeDuration("EDGE_SHUTDOWN_GRACE", "5 seconds", "How long sockets get to close on shutdown before they are terminated")
export const edgeId = Config.option(
  Config.string("EDGE_ID").pipe(Config.withDescription("This edge's id on the bus; random when unset"))
)
export const maxConnectionsPerAddress = Settings.nonNegativeInt(
  "EDGE_MAX_CONNECTIONS_PER_ADDRESS",
  1024,
  "Open sockets (and upgrades in progress) from one remote address before upgrades are refused with 429; 0 is no limit. " +
    "Behind a proxy that hides client addresses every socket has the proxy's, so set 0 there",
  "no limit"
)
export const maxConnectionsPerUser = Settings.nonNegativeInt(
  "EDGE_MAX_CONNECTIONS_PER_USER",
  256,
  "Open sockets whose upgrade carried a valid token, per token subject, before upgrades are refused with 429; 0 is no limit",
  "no limit"
)
export const headersTimeout = Settings.duration(
  "EDGE_HEADERS_TIMEOUT",
  "10 seconds",
  "How long a client has to send a request's headers (upgrades included) before the socket is closed"
)
export const requestTimeout = Settings.duration(
  "EDGE_REQUEST_TIMEOUT",
  "30 seconds",
  "How long a client has to send a whole HTTP request, body included; at least EDGE_HEADERS_TIMEOUT"
)
export const httpMaxBody = Settings.positiveInt("EDGE_HTTP_MAX_BODY", 4 * 1024 * 1024, "Largest Streamable HTTP request body at /hub in bytes; larger gets 413")
export const httpKeepAlive = Settings.duration(
  "EDGE_HTTP_KEEPALIVE",
  "15 seconds",
  "An SSE comment goes down every open Streamable HTTP stream this often, so proxies don't cut idle streams"
)
export const httpResponseTimeout = Settings.duration(
  "EDGE_HTTP_RESPONSE_TIMEOUT",
  "5 minutes",
  "How long a Streamable HTTP request waits for its session's next message before it is answered 504 (or its SSE stream ends)"
)
/**
 * A response the client has stopped reading holds what is written to it. Past EDGE_OUTBOUND_HWM
 * it is cut at once; this catches the slower case, bytes that sit unmoved below the bound.
 */
export const httpWriteStall = Settings.duration(
  "EDGE_HTTP_WRITE_STALL",
  "30 seconds",
  "How long bytes may wait, unmoved, in a Streamable HTTP response before the response is cut (and a POST's request cancelled)"
)
export const httpSessionCache = Settings.nonNegativeDuration(
  "EDGE_HTTP_SESSION_CACHE",
  "2 seconds",
  "How long an edge trusts that a Streamable HTTP session it looked up in KV still exists, before it looks again"
)
export const publicUrl = Config.option(
  Config.string("EDGE_PUBLIC_URL").pipe(
    Config.withDescription(
      "This edge's base URL as clients reach it (https://mcp.example.com), for OAuth metadata; requests must then name its host in Host. " +
        "Unset: from the Host header"
    ),
    Config.mapOrFail((text) => {
      const url = URL.canParse(text.trim()) ? new URL(text.trim()) : undefined
      return url !== undefined && (url.protocol === "http:" || url.protocol === "https:") && url.search === "" && url.hash === "" && url.username === ""
        ? Either.right(text.trim())
        : Either.left(ConfigError.InvalidData([], `EDGE_PUBLIC_URL must be an http(s) URL without query or credentials, got ${JSON.stringify(text)}`))
    })
  )
)
/**
 * Real JWTs are far smaller (an RS256 token with a few dozen claims is 1 to 2 KiB, Entra ID's with
 * group claims up to about 6 KiB), and proxies commonly cap a header at 8 KiB; a larger token is
 * refused before it reaches auth or any cache.
 */
export const maxTokenBytes = Settings.positiveInt(
  "EDGE_MAX_TOKEN_BYTES",
  8192,
  "Largest bearer token the edge takes (Authorization header or ?token=), in bytes; a longer one is refused 401 invalid_token without being verified"
)
