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
export const maxEnvelope = Config.integer("MCPX_MAX_ENVELOPE").pipe(
  Config.withDescription("Largest envelope in bytes"),
  Config.withDefault(64 * 1024)
)
export const maxParticipants = Config.integer("MCPX_MAX_PARTICIPANTS").pipe(
  Config.withDescription("Participants per topic"),
  Config.withDefault(1_000)
)
