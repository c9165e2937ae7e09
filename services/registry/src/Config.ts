/** Every setting of the tool registry, read once. The defaults are the MCP-B spec's numbers. */
import { Subjects } from "@switchboard/bus"
import { Settings } from "@switchboard/protocol"

export const callTimeout = Settings.duration("REGISTRY_CALL_TIMEOUT", "10 seconds", "How long one tools/call waits for the tab's answer")
export const retries = Settings.nonNegativeInt("REGISTRY_CALL_RETRIES", 3, "How often a call is sent again when its tab closes mid-call", "no retry")
export const retryBackoff = Settings.nonNegativeDuration("REGISTRY_RETRY_BACKOFF", "1 second", "The pause before such a retry")
export const tabWait = Settings.duration(
  "REGISTRY_TAB_WAIT",
  "10 seconds",
  "How long a call to a cached tool waits for the tab it had opened to register the tool"
)
export const staleTabAge = Settings.duration("REGISTRY_STALE_TAB_AGE", "1 hour", "Tab entries whose socket is gone are pruned once this old")
export const authTimeout = Settings.duration(
  "REGISTRY_AUTH_TIMEOUT",
  "10 seconds",
  "How long a /hub socket without a token has to send authenticate, and a /tabs socket to send authenticate (without a token) and browser/hello"
)
export const pageSize = Settings.positiveInt("REGISTRY_PAGE_SIZE", 100, "Tools per tools/list page")
export const pageBytes = Settings.positiveInt(
  "REGISTRY_PAGE_BYTES",
  512 * 1024,
  "Bytes of tools per tools/list page (a page always holds at least one tool); keep it under the bus's largest message (NATS: 1 MiB by default) and the edge's EDGE_OUTBOUND_HWM"
)
export const maxToolBytes = Settings.positiveInt(
  "REGISTRY_MAX_TOOL_BYTES",
  64 * 1024,
  "Largest tool a tab may register, as JSON (name, title, description, schemas, annotations); bigger ones are rejected"
)
export const warningInterval = Settings.duration(
  "REGISTRY_WARNING_INTERVAL",
  "10 seconds",
  "At most one warning per /tabs socket this often about what it sent; the next one counts those held back"
)
export const maxToolsPerTab = Settings.positiveInt("REGISTRY_MAX_TOOLS_PER_TAB", 256, "Tools one tab may register; the rest are rejected")
export const maxPending = Settings.positiveInt("REGISTRY_MAX_PENDING", 1_000, "Calls in flight per /hub session")
export const replicaHeartbeat = Settings.livenessInterval(
  "REGISTRY_REPLICA_HEARTBEAT",
  "2 seconds",
  Subjects.Bucket.replicas.ttl,
  "Liveness period of a registry replica; survivors adopt its sockets after it stops"
)
export const shutdownGrace = Settings.duration(
  "REGISTRY_SHUTDOWN_GRACE",
  "10 seconds",
  "How long a stopping registry replica may take to hand its sessions and tabs to the other replicas (well under Kubernetes' 30 s)"
)
export const httpReplayEvents = Settings.nonNegativeInt(
  "REGISTRY_HTTP_REPLAY_EVENTS",
  100,
  "Server-initiated events a Streamable HTTP /hub session keeps for a GET stream that resumes with Last-Event-ID", "no replay"
)
export const httpReplayAge = Settings.duration("REGISTRY_HTTP_REPLAY_AGE", "5 minutes", "How long a Streamable HTTP /hub session keeps an event for resumption")
export const maxHttpSessionsPerUser = Settings.positiveInt(
  "REGISTRY_MAX_HTTP_SESSIONS_PER_USER",
  100,
  "Streamable HTTP /hub sessions one user may hold at once, per registry replica (a session lives until DELETE or REGISTRY_HTTP_SESSION_IDLE)"
)
export const httpSessionIdle = Settings.duration(
  "REGISTRY_HTTP_SESSION_IDLE",
  "30 minutes",
  "A Streamable HTTP /hub session without any request for this long ends (its id then gets 404)"
)
export const statelessIdle = Settings.duration(
  "REGISTRY_STATELESS_IDLE",
  "5 minutes",
  "How long a replica keeps a user's tool view warm after that user's last MCP 2026-07-28 request (no session): the next request then needs no KV read"
)
export const maxTasksPerUser = Settings.positiveInt(
  "REGISTRY_MAX_TASKS_PER_USER",
  100,
  "MCP 2026-07-28 tasks one user may have stored at once (working or finished, until REGISTRY_TASK_TTL); past it, a tools/call is answered directly, without a task"
)
export const taskTtl = Settings.duration(
  "REGISTRY_TASK_TTL",
  "1 hour",
  "How long an MCP 2026-07-28 task and its result are kept from its creation (its ttlMs); the tasks bucket's age limit"
)
