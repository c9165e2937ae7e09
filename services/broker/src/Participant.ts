/**
 * One MCPx participant's actor, once admitted to its topic (see `Admission.ts`):
 * it checks every envelope (shape, `from`, duplicate ids, privilege, size and rate) and appends
 * the accepted ones to the topic's history; its topic's sequencer sends them out.
 */
import { SpanKind, type Tracer } from "@opentelemetry/api"
import { type Actors, type Journal, type Kv, RateBudget, Subjects } from "@switchboard/bus"
import { type Auth, Json, JsonRpc, Mcpx } from "@switchboard/protocol"
import { Telemetry } from "@switchboard/telemetry"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { randomUUID } from "node:crypto"

const decodeEnvelope = Schema.decodeUnknownEither(Mcpx.Envelope)
const isRecord = JsonRpc.isRecord

export const now = () => new Date().toISOString()

/** A message from the gateway itself. */
export const gateway = (kind: Mcpx.Kind, payload: Record<string, unknown>, extra: { to?: ReadonlyArray<string>; correlation_id?: string } = {}) =>
  JSON.stringify({ protocol: Mcpx.PROTOCOL, id: randomUUID(), ts: now(), from: Mcpx.GATEWAY, ...extra, kind, payload })

/**
 * How many envelope ids per participant are remembered to refuse duplicates, and how many
 * characters of them: ids are up to `Mcpx.MAX_ID_LENGTH` long, and 10,000 of those would be 2.5 MB
 * per participant. 512 Ki characters hold 10,000 UUIDs.
 */
const REMEMBERED_IDS = 10_000
const REMEMBERED_ID_CHARS = 512 * 1024

/** What every participant of a broker replica shares. */
export interface Room {
  readonly config: {
    readonly maxEnvelope: number
    readonly rate: number
    readonly burst: number
    readonly chatRate: number
    readonly chatBurst: number
  }
  readonly history: Journal.JournalLog
  readonly members: Kv.TypedBucket<Mcpx.Member>
  readonly tracer: Option.Option<Tracer>
  /** Tells the topic's sequencer of a join or a leave. */
  readonly toTopic: (topic: string, event: Mcpx.TopicJoin | Mcpx.TopicLeave) => void
}

/**
 * A participant's actor. A class, so that every participant shares its handlers: as closures over
 * the actor's variables they were six functions and their contexts per idle socket (issue 16).
 */
export class Participant implements Actors.Actor<never, Mcpx.ParticipantPeer> {
  private readonly budget: RateBudget
  private readonly chatBudget: RateBudget
  /** Ids of this participant's accepted envelopes, oldest first, and their total length. */
  private readonly seen = new Set<string>()
  private seenChars = 0

  constructor(
    private readonly room: Room,
    private readonly conn: Actors.Connection,
    private readonly topic: string,
    private readonly id: string,
    /** As the sequencer knows it: the privilege, and whether an admin assigned it. */
    private member: Mcpx.Member
  ) {
    const { burst, chatBurst, chatRate, rate } = room.config
    this.budget = new RateBudget(rate, burst)
    this.chatBudget = new RateBudget(chatRate, chatBurst)
  }

  private remember(envelopeId: string) {
    const seen = this.seen
    seen.add(envelopeId)
    this.seenChars += envelopeId.length
    for (const oldest of seen) {
      if (seen.size <= REMEMBERED_IDS && this.seenChars <= REMEMBERED_ID_CHARS) break
      seen.delete(oldest)
      this.seenChars -= oldest.length
    }
  }

  private forget(envelopeId: string) {
    if (this.seen.delete(envelopeId)) this.seenChars -= envelopeId.length
  }

  private refuse(code: Mcpx.ErrorCode, reason: string, correlation?: string) {
    this.conn.send(
      gateway("system", { event: "error", code, reason }, { to: [this.id], ...(correlation === undefined ? {} : { correlation_id: correlation }) })
    )
  }

  onFrame(frame: Actors.Frame): void {
    const { config, history, tracer } = this.room
    const { conn, id, topic } = this
    // Before parsing: an envelope too large to accept is not worth reading.
    if (frame.data.byteLength > config.maxEnvelope) {
      return this.refuse("too_large", `envelopes are limited to ${config.maxEnvelope} bytes`)
    }
    // Bounded depth: nesting thousands deep would overflow the stack of whatever re-encodes the
    // envelope later (the ts stamp below, the history API), far from here.
    const parsed = Json.parse(frame.text)
    if (Either.isLeft(parsed)) return this.refuse("invalid_envelope", `invalid JSON: ${parsed.left}`)
    const raw = parsed.right
    const correlation = isRecord(raw) && typeof raw["id"] === "string" && raw["id"].length <= Mcpx.MAX_ID_LENGTH ? raw["id"] : undefined
    if (frame.limited || this.budget.take() !== "ok") {
      return this.refuse("rate_limited", `rate limit exceeded (${config.rate}/s, burst ${config.burst})`, correlation)
    }
    const decoded = decodeEnvelope(raw)
    if (Either.isLeft(decoded)) {
      return this.refuse("invalid_envelope", ParseResult.TreeFormatter.formatErrorSync(decoded.left), correlation)
    }
    const envelope = decoded.right
    if (envelope.kind === "chat" && this.chatBudget.take() !== "ok") {
      return this.refuse("rate_limited", `chat rate limit exceeded (${config.chatRate}/s, burst ${config.chatBurst})`, envelope.id)
    }
    if (envelope.from !== id) return this.refuse("spoofed_from", `from must be your participant id (${id})`, envelope.id)
    if (envelope.kind === "system") return this.refuse("forbidden_kind", "only the gateway sends system messages", envelope.id)
    if (envelope.kind === "presence" && Mcpx.GATEWAY_PRESENCE_EVENTS.has(envelope.payload["event"])) {
      return this.refuse("forbidden_kind", "only the gateway announces joins and leaves", envelope.id)
    }
    if (this.seen.has(envelope.id)) return this.refuse("duplicate_id", `envelope id ${envelope.id} was already used`, envelope.id)
    if (envelope.kind === "mcp" && this.member.privilege === "restricted") {
      // §4.4.2: the violator alone hears of it, as an MCP error to its own request.
      return conn.send(
        gateway(
          "mcp",
          {
            jsonrpc: "2.0",
            id: envelope.payload["id"] ?? null,
            error: {
              code: -32001,
              message: "Privilege violation",
              data: {
                reason: "Restricted participants cannot send MCP messages directly",
                suggestion: "Use kind: 'mcp/proposal' instead"
              }
            }
          },
          { to: [id], correlation_id: envelope.id }
        )
      )
    }
    // Accepted: only now does its id count as used, so refused envelopes cost no memory here.
    this.remember(envelope.id)
    const traced = Option.isSome(tracer)
      ? Telemetry.startSpan(tracer.value, `broker.accept ${envelope.kind}`, frame.traceparent, {
        kind: SpanKind.CONSUMER,
        attributes: { "mcpx.topic": topic, "mcpx.envelope.id": envelope.id, "mcpx.from": id, "sb.conn": conn.id }
      })
      : undefined
    // Stamp ts when missing; otherwise the envelope travels exactly as it was sent. Stored first,
    // sent out by the sequencer once stored: what a member receives is in the history. The parsed
    // frame is this call's own, so it takes ts itself: a spread's copy stringifies about 1.6×
    // slower (4.6 against 2.8 µs for a small envelope, Node 20).
    const envelopeId = envelope.id
    history.append(Subjects.historyKey(topic), envelope.ts === undefined ? JSON.stringify(Object.assign(raw as object, { ts: now() })) : frame.text, {
      traceparent: traced?.traceparent,
      lost: (why) => {
        // Nobody received it, so its id is free for the sender to try again.
        this.forget(envelopeId)
        this.refuse("not_stored", `the topic's history could not store the envelope, so nobody received it: ${why}`, envelopeId)
      }
    })
    traced?.span.end()
  }

  onClosed(): Effect.Effect<void> {
    const { conn, id, topic } = this
    const { members, toTopic } = this.room
    return Effect.suspend(() => {
      toTopic(topic, new Mcpx.TopicLeave({ participant: id, conn: conn.id }))
      // The same participant back on a newer socket may own the record already, or write it meanwhile.
      return members.deleteOwned(Subjects.Key.member(topic, id), (member) => member.conn === conn.id)
    }).pipe(
      Effect.asVoid,
      Effect.catchAll((e) => Effect.logWarning(`could not forget ${id}'s membership of topic ${topic}`, e))
    )
  }

  /** An admin changed this participant's privilege (the KV record is already updated). A field: the host hands it on unbound. */
  readonly receive = (message: Mcpx.ParticipantPeer): void => {
    const privilege: Auth.Privilege = message.privilege
    const { id, topic } = this
    this.member = { ...this.member, privilege, assigned: true }
    this.room.toTopic(topic, new Mcpx.TopicJoin({ member: this.member }))
    this.conn.send(gateway("system", { event: "privilege", participant: { id, privilege } }, { to: [id] }))
  }
}
