/** Every setting of the MCPx broker, read once. Defaults never get in the way of normal use. */
import { type Journal, Subjects } from "@switchboard/bus"
import { Settings } from "@switchboard/protocol"
import * as Config from "effect/Config"

export const mode = Config.literal("mixed", "open")("MCPX_MODE").pipe(
  Config.withDescription("mixed: the token's privilege claim decides (none = restricted); open: everyone is full"),
  Config.withDefault("mixed")
)
export const topicModes = Config.string("MCPX_TOPIC_MODES").pipe(
  Config.withDescription("Per-topic mode overrides, e.g. lobby=open,ops=mixed"),
  Config.withDefault(""),
  Config.map((s) =>
    new Map(
      s.split(",").map((p) => p.trim()).filter((p) => p.includes("=")).map((p) => {
        const i = p.lastIndexOf("=")
        return [p.slice(0, i), p.slice(i + 1) === "open" ? "open" as const : "mixed" as const] as const
      })
    )
  )
)
export const rate = Settings.positiveNumber("MCPX_RATE", 100, "Envelopes per second per participant")
export const burst = Settings.atLeast("MCPX_BURST", 200, "Burst per participant", rate, "MCPX_RATE")
export const chatRate = Settings.positiveNumber("MCPX_CHAT_RATE", 100, "Chat envelopes per second per participant (also counted in MCPX_RATE)")
export const chatBurst = Settings.atLeast("MCPX_CHAT_BURST", 200, "Chat burst per participant", chatRate, "MCPX_CHAT_RATE")
export const maxEnvelope = Settings.positiveInt("MCPX_MAX_ENVELOPE", 64 * 1024, "Largest envelope in bytes")
export const maxParticipants = Settings.positiveInt("MCPX_MAX_PARTICIPANTS", 1_000, "Participants per topic")
export const historyLimit = Settings.positiveInt("MCPX_HISTORY_LIMIT", 1_000, "Envelopes kept per topic for GET /v0/topics/{topic}/history")
export const historyAge = Settings.duration("MCPX_HISTORY_AGE", "24 hours", "How long a topic's history keeps an envelope")
export const historyTotalBytes = Settings.positiveInt(
  "MCPX_HISTORY_TOTAL_BYTES",
  64 * 1024 * 1024,
  "Bytes of history all topics keep together (the history stream's max_bytes on NATS); the oldest go first"
)
/**
 * A page's answer goes back to the edge as one bus message, so it must fit a NATS server's
 * max_payload: 1 MiB on a server started with defaults (`nats-server -js`). Half of that leaves
 * room for the answer's framing and for envelopes whose JSON grows when it is written again.
 */
export const historyPageBytes = Settings.positiveInt(
  "MCPX_HISTORY_PAGE_BYTES",
  512 * 1024,
  "Largest history page in bytes of envelopes (one envelope larger than this still comes alone); fewer envelopes than `limit` come, with `more` and the cursor to go on"
)
export const historyReads = Settings.positiveInt(
  "MCPX_HISTORY_READS",
  4,
  "History page reads one broker process runs at once; more wait their turn (see MCPX_HISTORY_READS_WAITING)"
)
export const historyReadsWaiting = Settings.nonNegativeInt(
  "MCPX_HISTORY_READS_WAITING",
  32,
  "History page reads one broker process keeps waiting for MCPX_HISTORY_READS; past it a read is answered 503 with Retry-After",
  "none waits"
)
export const historyRetry = Settings.duration(
  "MCPX_HISTORY_RETRY",
  "30 seconds",
  "How long an envelope that cannot be stored is retried before its sender gets a not_stored error"
)

/** Set by deployments from before the one history stream; read only to say it does nothing now. */
export const removedHistoryBytes = Config.option(Config.string("MCPX_HISTORY_BYTES")).pipe(
  Config.withDescription("Removed: a topic's history is bounded by MCPX_HISTORY_LIMIT, all topics' by MCPX_HISTORY_TOTAL_BYTES")
)

/**
 * The one journal that holds every topic's history, a key per topic. A topic's own bytes are
 * bounded by MCPX_HISTORY_LIMIT × MCPX_MAX_ENVELOPE, and all topics' by MCPX_HISTORY_TOTAL_BYTES:
 * JetStream has no byte limit per subject, so the per-topic MCPX_HISTORY_BYTES of one stream per
 * topic is gone.
 */
export const history = Config.all({ limit: historyLimit, age: historyAge, total: historyTotalBytes, retry: historyRetry }).pipe(
  Config.map(({ age, limit, retry, total }): Journal.JournalSpec => ({
    name: Subjects.JournalName.history,
    maxMessagesPerKey: limit,
    maxAge: age,
    maxBytes: total,
    retryFor: retry
  }))
)
export const topicIdle = Settings.nonNegativeDuration(
  "MCPX_TOPIC_IDLE",
  "1 minute",
  "How long a topic stays set up after its last participant left; its history is kept either way"
)
export const replicaHeartbeat = Settings.livenessInterval(
  "BROKER_REPLICA_HEARTBEAT",
  "2 seconds",
  Subjects.Bucket.replicas.ttl,
  "Liveness period of a broker replica; survivors adopt its sockets and topics after it stops"
)
