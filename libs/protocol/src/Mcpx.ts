/**
 * MCPx v0.1 (`shared/specs/mcpx-v0.1.md`): the envelope every topic message travels in, the
 * gateway's system messages, and the broker's internal records. v0 envelopes (`mcp-x/v0`) are
 * accepted as they are.
 */
import * as Schema from "effect/Schema"
import { Privilege } from "./Auth.ts"

export const PROTOCOL = "mcpx/v0.1"
export const GATEWAY = "system:gateway"
/**
 * Participant ids in this namespace are the gateway's: a participant named like it could speak
 * with the gateway's voice (`from: "system:gateway"`), so no token may join as one.
 */
export const RESERVED_PREFIX = "system:"
export const isReserved = (participant: string): boolean => participant.startsWith(RESERVED_PREFIX)

/**
 * The longest envelope id, participant id and topic name. Ids are remembered per participant to
 * refuse duplicates, and ids and topics become KV keys and subjects; none has a use for more.
 */
export const MAX_ID_LENGTH = 256
export const MAX_TOPIC_LENGTH = 256

export const Kind = Schema.Literal("mcp", "mcp/proposal", "chat", "presence", "system")
export type Kind = typeof Kind.Type

export const Envelope = Schema.Struct({
  protocol: Schema.Literal("mcpx/v0.1", "mcp-x/v0"),
  id: Schema.NonEmptyString.pipe(Schema.maxLength(MAX_ID_LENGTH)),
  ts: Schema.optional(Schema.String),
  from: Schema.String,
  to: Schema.optional(Schema.Array(Schema.String)),
  kind: Kind,
  correlation_id: Schema.optional(Schema.String),
  payload: Schema.Record({ key: Schema.String, value: Schema.Unknown })
})
export type Envelope = typeof Envelope.Type

export const Participant = Schema.Struct({ id: Schema.String, privilege: Privilege })
export type Participant = typeof Participant.Type

/**
 * Presence events only the gateway announces: a participant's own `join` or `leave` would let it
 * add or remove someone from everyone's roster. Other presence (a status) is the participant's.
 */
export const GATEWAY_PRESENCE_EVENTS: ReadonlySet<unknown> = new Set(["join", "leave"])

/** What the broker's error envelopes say went wrong (`payload.code`). */
export type ErrorCode =
  | "invalid_envelope"
  | "spoofed_from"
  | "duplicate_id"
  | "forbidden_kind"
  | "rate_limited"
  | "too_large"
  /** Accepted, but the topic's history could not store it in time: nobody received it. */
  | "not_stored"

/** A participant's membership of a topic (`broker_members`, keyed by topic and participant). */
export const Member = Schema.Struct({
  topic: Schema.String,
  participant: Schema.String,
  privilege: Privilege,
  conn: Schema.String,
  edge: Schema.String,
  joinedAt: Schema.Number,
  /** The privilege was set by an admin (promote/demote) rather than by the token. */
  assigned: Schema.optional(Schema.Boolean)
})
export type Member = typeof Member.Type

/** Participant actor → topic sequencer: a join or a leave, ordered with the topic's envelopes. */
export const Join = Member
export const Leave = Schema.Struct({ participant: Schema.String, conn: Schema.String })
export type Leave = typeof Leave.Type

/**
 * The `kind` header of messages to a topic sequencer. The last three only pass while a stopping
 * replica hands a topic to another (see `TopicHandoff`).
 */
export const TopicKind = {
  envelope: "envelope",
  join: "join",
  leave: "leave",
  /** The new sequencer listens from here: the old one forwards what it received before this. */
  marker: "marker",
  /** A join or leave the old sequencer received before the marker (`TopicForward`). */
  forwarded: "forwarded",
  /** The old sequencer forwarded everything: the new one handles what it received itself. */
  forwardEnd: "forward-end"
} as const

/**
 * A stopping broker replica asks another (the broker's queue group) to sequence one of its topics:
 * with its members as they are, from the last history sequence it sent out. The new sequencer
 * subscribes, publishes a marker with `token` on the topic's subject, and takes the claim from
 * `from` (compare-and-set) before it answers.
 */
export const TopicHandoff = Schema.Struct({
  topic: Schema.String,
  from: Schema.String,
  token: Schema.String,
  delivered: Schema.Number,
  members: Schema.Array(Member)
})
export type TopicHandoff = typeof TopicHandoff.Type

export const TopicHandoffReply = Schema.Union(
  Schema.Struct({ ok: Schema.Literal(true), replica: Schema.String }),
  Schema.Struct({ ok: Schema.Literal(false), reason: Schema.String })
)
export type TopicHandoffReply = typeof TopicHandoffReply.Type

/** A message the old sequencer received before the marker, as it came. */
export const TopicForward = Schema.Struct({ kind: Schema.String, data: Schema.String })
