/** Every setting of the MCPx broker, read once. Defaults never get in the way of normal use. */
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
export const rate = Config.number("MCPX_RATE").pipe(
  Config.withDescription("Envelopes per second per participant"),
  Config.withDefault(100)
)
export const burst = Config.number("MCPX_BURST").pipe(Config.withDescription("Burst per participant"), Config.withDefault(200))
export const chatRate = Config.number("MCPX_CHAT_RATE").pipe(
  Config.withDescription("Chat envelopes per second per participant (also counted in MCPX_RATE)"),
  Config.withDefault(100)
)
export const chatBurst = Config.number("MCPX_CHAT_BURST").pipe(
  Config.withDescription("Chat burst per participant"),
  Config.withDefault(200)
)
export const maxEnvelope = Config.integer("MCPX_MAX_ENVELOPE").pipe(
  Config.withDescription("Largest envelope in bytes"),
  Config.withDefault(64 * 1024)
)
export const maxParticipants = Config.integer("MCPX_MAX_PARTICIPANTS").pipe(
  Config.withDescription("Participants per topic"),
  Config.withDefault(1_000)
)
export const historyLimit = Config.integer("MCPX_HISTORY_LIMIT").pipe(
  Config.withDescription("Envelopes kept per topic for GET /v0/topics/{topic}/history"),
  Config.withDefault(1_000)
)
export const historyAge = Config.duration("MCPX_HISTORY_AGE").pipe(
  Config.withDescription("How long a topic's history keeps an envelope"),
  Config.withDefault("24 hours")
)
export const historyBytes = Config.integer("MCPX_HISTORY_BYTES").pipe(
  Config.withDescription("Bytes of envelopes kept per topic's history; the oldest go first"),
  Config.withDefault(4 * 1024 * 1024)
)
export const historyTotalBytes = Config.integer("MCPX_HISTORY_TOTAL_BYTES").pipe(
  Config.withDescription(
    "Bytes of history all topics keep together on the embedded bus; the oldest go first (on NATS, the account's JetStream limits bound it)"
  ),
  Config.withDefault(64 * 1024 * 1024)
)

/** A journal's name for a topic: what the history API looks for without creating it. */
export const historyName = (topic: string) => `history_${Buffer.from(topic, "utf8").toString("base64url")}`

/** The journal that keeps a topic's history, as the sequencer opens it. */
export const history = Config.all({ limit: historyLimit, age: historyAge, bytes: historyBytes, total: historyTotalBytes }).pipe(
  Config.map(({ age, bytes, limit, total }) => (topic: string) => ({
    name: historyName(topic),
    maxMessages: limit,
    maxAge: age,
    maxBytes: bytes,
    totalBytes: total
  }))
)
export const topicIdle = Config.duration("MCPX_TOPIC_IDLE").pipe(
  Config.withDescription("How long a topic stays set up after its last participant left; its history is kept either way"),
  Config.withDefault("1 minute")
)
export const replicaHeartbeat = Config.duration("BROKER_REPLICA_HEARTBEAT").pipe(
  Config.withDescription("Liveness period of a broker replica; survivors adopt its sockets and topics after it stops"),
  Config.withDefault("2 seconds")
)
