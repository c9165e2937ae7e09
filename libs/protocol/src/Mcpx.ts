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

// --- the broker's peer protocols ---------------------------------------------------------------

/** Participant actor → topic sequencer: a join (or a changed privilege), ordered with the topic's envelopes. */
export class TopicJoin extends Schema.TaggedClass<TopicJoin>()("TopicJoin", { member: Member }) {}
/** Participant actor → topic sequencer: the participant's socket closed. */
export class TopicLeave extends Schema.TaggedClass<TopicLeave>()("TopicLeave", { participant: Schema.String, conn: Schema.String }) {}
/**
 * The new sequencer of a topic a stopping replica hands over (see `TopicHandoff`) listens from
 * here: the old one forwards what it received before this.
 */
export class TopicMarker extends Schema.TaggedClass<TopicMarker>()("TopicMarker", { token: Schema.String }) {}
/** A join or leave the old sequencer received before the marker, as it came. */
export class TopicForwarded extends Schema.TaggedClass<TopicForwarded>()("TopicForwarded", {
  event: Schema.Union(TopicJoin, TopicLeave)
}) {}
/** The old sequencer forwarded everything: the new one handles what it received itself. */
export class TopicForwardEnd extends Schema.TaggedClass<TopicForwardEnd>()("TopicForwardEnd", { token: Schema.String }) {}

/** Everything on a topic's subject but its envelopes (which go through its history). */
export const TopicEvent = Schema.Union(TopicJoin, TopicLeave, TopicMarker, TopicForwarded, TopicForwardEnd)
export type TopicEvent = typeof TopicEvent.Type

/** The admin API → a participant's actor: an admin changed its privilege (its KV record says so already). */
export class PrivilegeChanged extends Schema.TaggedClass<PrivilegeChanged>()("PrivilegeChanged", { privilege: Privilege }) {}

/** Every message to a participant's actor from elsewhere in the broker. */
export const ParticipantPeer = Schema.Union(PrivilegeChanged)
export type ParticipantPeer = typeof ParticipantPeer.Type

/** Why a replica did not take a topic on: it stops too, has the topic already, or the claim is not the asker's. */
export class TopicHandoffRefused extends Schema.TaggedError<TopicHandoffRefused>()("TopicHandoffRefused", { reason: Schema.String }) {}

/**
 * A stopping broker replica asks another (the broker's queue group) to sequence one of its topics:
 * with its members as they are, from the last history sequence it sent out. The new sequencer
 * subscribes, publishes a marker with `token` on the topic's subject, and takes the claim from
 * `from` (compare-and-set) before it answers with its replica id.
 */
export class TopicHandoff extends Schema.TaggedRequest<TopicHandoff>()("TopicHandoff", {
  failure: TopicHandoffRefused,
  success: Schema.Struct({ replica: Schema.String }),
  payload: {
    topic: Schema.String,
    from: Schema.String,
    token: Schema.String,
    delivered: Schema.Number,
    members: Schema.Array(Member)
  }
}) {}

/** What one broker replica asks of another, on the broker's queue group. */
export const BrokerPeer = Schema.Union(TopicHandoff)
export type BrokerPeer = typeof BrokerPeer.Type
