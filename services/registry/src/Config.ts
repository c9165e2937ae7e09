/** Every setting of the tool registry, read once. The defaults are the MCP-B spec's numbers. */
import * as Config from "effect/Config"

export const callTimeout = Config.duration("REGISTRY_CALL_TIMEOUT").pipe(
  Config.withDescription("How long one tools/call waits for the tab's answer"),
  Config.withDefault("10 seconds")
)
export const retries = Config.integer("REGISTRY_CALL_RETRIES").pipe(
  Config.withDescription("How often a call is sent again when its tab closes mid-call"),
  Config.withDefault(3)
)
export const retryBackoff = Config.duration("REGISTRY_RETRY_BACKOFF").pipe(
  Config.withDescription("The pause before such a retry"),
  Config.withDefault("1 second")
)
export const tabWait = Config.duration("REGISTRY_TAB_WAIT").pipe(
  Config.withDescription("How long a call to a cached tool waits for the tab it had opened to register the tool"),
  Config.withDefault("10 seconds")
)
export const staleTabAge = Config.duration("REGISTRY_STALE_TAB_AGE").pipe(
  Config.withDescription("Tab entries whose socket is gone are pruned once this old"),
  Config.withDefault("1 hour")
)
export const authTimeout = Config.duration("REGISTRY_AUTH_TIMEOUT").pipe(
  Config.withDescription("How long a /hub socket without a token has to send authenticate, and a /tabs socket browser/hello"),
  Config.withDefault("10 seconds")
)
export const pageSize = Config.integer("REGISTRY_PAGE_SIZE").pipe(
  Config.withDescription("Tools per tools/list page"),
  Config.withDefault(100)
)
export const pageBytes = Config.integer("REGISTRY_PAGE_BYTES").pipe(
  Config.withDescription(
    "Bytes of tools per tools/list page (a page always holds at least one tool); keep it under the bus's largest message (NATS: 1 MiB by default) and the edge's EDGE_OUTBOUND_HWM"
  ),
  Config.withDefault(512 * 1024)
)
export const maxToolBytes = Config.integer("REGISTRY_MAX_TOOL_BYTES").pipe(
  Config.withDescription("Largest tool a tab may register, as JSON (name, title, description, schemas, annotations); bigger ones are rejected"),
  Config.withDefault(64 * 1024)
)
export const warningInterval = Config.duration("REGISTRY_WARNING_INTERVAL").pipe(
  Config.withDescription("At most one warning per /tabs socket this often about what it sent; the next one counts those held back"),
  Config.withDefault("10 seconds")
)
export const maxToolsPerTab = Config.integer("REGISTRY_MAX_TOOLS_PER_TAB").pipe(
  Config.withDescription("Tools one tab may register; the rest are rejected"),
  Config.withDefault(256)
)
export const maxPending = Config.integer("REGISTRY_MAX_PENDING").pipe(
  Config.withDescription("Calls in flight per /hub session"),
  Config.withDefault(1_000)
)
export const replicaHeartbeat = Config.duration("REGISTRY_REPLICA_HEARTBEAT").pipe(
  Config.withDescription("Liveness period of a registry replica; survivors adopt its sockets after it stops"),
  Config.withDefault("2 seconds")
)
export const httpReplayEvents = Config.integer("REGISTRY_HTTP_REPLAY_EVENTS").pipe(
  Config.validate({ message: "REGISTRY_HTTP_REPLAY_EVENTS must be 0 or more", validation: (n) => n >= 0 }),
  Config.withDescription("Server-initiated events a Streamable HTTP /hub session keeps for a GET stream that resumes with Last-Event-ID"),
  Config.withDefault(100)
)
export const httpReplayAge = Config.duration("REGISTRY_HTTP_REPLAY_AGE").pipe(
  Config.withDescription("How long a Streamable HTTP /hub session keeps an event for resumption"),
  Config.withDefault("5 minutes")
)
export const httpSessionIdle = Config.duration("REGISTRY_HTTP_SESSION_IDLE").pipe(
  Config.withDescription("A Streamable HTTP /hub session without any request for this long ends (its id then gets 404)"),
  Config.withDefault("30 minutes")
)
