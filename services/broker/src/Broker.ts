/**
 * The MCPx v0.1 topic broker. Each socket is a participant actor: it checks every envelope
 * (shape, `from`, duplicate ids, privilege, size and rate) and hands the accepted ones to its
 * topic's sequencer. One sequencer per topic, claimed in KV, receives the topic's envelopes, joins
 * and leaves on one subject; the order it receives them in is the topic's total order, and it
 * fans each one out with one publish per edge that has members.
 */
import { Actors, Bus, Journal, Kv, RateBudget, Subjects } from "@switchboard/bus"
import { type Auth, Edge, Json, JsonRpc, Mcpx } from "@switchboard/protocol"
import * as Deferred from "effect/Deferred"
import { SpanKind } from "@opentelemetry/api"
import { Telemetry } from "@switchboard/telemetry"
import * as Effect from "effect/Effect"
import * as ExecutionStrategy from "effect/ExecutionStrategy"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import * as AdminApi from "./AdminApi.ts"
import * as BrokerConfig from "./Config.ts"

const CloseCode = Edge.CloseCode
const decoder = new TextDecoder()
const decodeEnvelope = Schema.decodeUnknownEither(Mcpx.Envelope)
const joinCodec = Json.codec(Mcpx.Join)
const leaveCodec = Json.codec(Mcpx.Leave)

const now = () => new Date().toISOString()
const isRecord = JsonRpc.isRecord

/** A message from the gateway itself. */
const gateway = (kind: Mcpx.Kind, payload: Record<string, unknown>, extra: { to?: ReadonlyArray<string>; correlation_id?: string } = {}) =>
  JSON.stringify({ protocol: Mcpx.PROTOCOL, id: randomUUID(), ts: now(), from: Mcpx.GATEWAY, ...extra, kind, payload })

/** How many envelope ids per participant are remembered to refuse duplicates. */
const REMEMBERED_IDS = 10_000

/** The sequencer of one topic: its members by participant id, in join order. */
interface Topic {
  readonly name: string
  readonly members: Map<string, Mcpx.Member>
  readonly history: Journal.JournalHandle
  /** One handle per edge with members, rebuilt only when membership changes. */
  everyone: ReadonlyArray<Actors.Socket> | undefined
}

export const make = Effect.gen(function*() {
  const bus = yield* Bus.Bus
  const kv = yield* Kv.Kv
  const link = yield* Actors.edgeLink
  const config = {
    mode: yield* BrokerConfig.mode,
    topicModes: yield* BrokerConfig.topicModes,
    rate: yield* BrokerConfig.rate,
    burst: yield* BrokerConfig.burst,
    chatRate: yield* BrokerConfig.chatRate,
    chatBurst: yield* BrokerConfig.chatBurst,
    maxEnvelope: yield* BrokerConfig.maxEnvelope,
    maxParticipants: yield* BrokerConfig.maxParticipants,
    history: yield* BrokerConfig.history,
    replicaHeartbeat: yield* BrokerConfig.replicaHeartbeat
  }
  const journal = yield* Journal.Journal
  const claims = yield* kv.bucket(Subjects.Bucket.topics)
  const replicas = yield* kv.bucket(Subjects.Bucket.replicas)
  const members = Kv.typed(yield* kv.bucket(Subjects.Bucket.members), Mcpx.Member)
  const replica = randomUUID()
  const scope = yield* Effect.scope
  /** Topics this replica sequences. */
  const sequenced = new Map<string, Topic>()

  const toTopic = (topic: string, kind: string, data: string, traceparent?: string) =>
    bus.unsafePublish(Subjects.topic(topic), data, Actors.peerHeaders(kind, traceparent))
  const { tracer } = yield* Telemetry.Tracing

  // --- the sequencer of a topic ------------------------------------------------------------

  /** One handle per edge that has members (but `except`): each send is one publish per edge. */
  const byEdge = (topic: Topic, except?: string): ReadonlyArray<Actors.Socket> => {
    const conns = new Map<string, Array<Subjects.ConnId>>()
    for (const m of topic.members.values()) {
      if (m.participant === except) continue
      const group = conns.get(m.edge)
      if (group) group.push(Subjects.ConnId(m.conn))
      else conns.set(m.edge, [Subjects.ConnId(m.conn)])
    }
    return [...conns].map(([edge, group]) => link.toMany(Subjects.EdgeId(edge), group))
  }

  /** Sends one frame to every member (but `except`). */
  const fanOut = (topic: Topic, data: string | Uint8Array, except?: string, traceparent?: string) => {
    const sockets = except === undefined ? (topic.everyone ??= byEdge(topic)) : byEdge(topic, except)
    for (const s of sockets) s.send(data, traceparent)
  }

  const setMember = (topic: Topic, m: Mcpx.Member) => {
    topic.members.set(m.participant, m)
    topic.everyone = undefined
  }

  const participantsOf = (topic: Topic): ReadonlyArray<Mcpx.Participant> =>
    [...topic.members.values()].map((m) => ({ id: m.participant, privilege: m.privilege }))

  const onTopicMessage = (topic: Topic) => (message: Bus.BusMessage) => {
    const kind = message.header(Subjects.Header.kind)
    if (kind === Mcpx.TopicKind.envelope) {
      const traced = Option.isSome(tracer)
        ? Telemetry.startSpan(tracer.value, "broker.fanout", message.header(Subjects.Header.traceparent), {
          kind: SpanKind.PRODUCER,
          attributes: { "mcpx.topic": topic.name, "mcpx.members": topic.members.size }
        })
        : undefined
      fanOut(topic, message.data, undefined, traced?.traceparent)
      topic.history.append(message.data)
      return traced?.span.end()
    }
    const body = Bus.text(message)
    if (kind === Mcpx.TopicKind.join) {
      const join = joinCodec.decode(body)
      if (Either.isLeft(join)) return
      const m = join.right
      const previous = topic.members.get(m.participant)
      // The same socket again: an adopted actor, or a changed privilege. No welcome, no presence.
      if (previous?.conn === m.conn) return setMember(topic, m)
      if (previous === undefined && topic.members.size >= config.maxParticipants) {
        return link.close(Subjects.EdgeId(m.edge), Subjects.ConnId(m.conn), CloseCode.PolicyViolation, "topic is full")
      }
      setMember(topic, m)
      const participant = { id: m.participant, privilege: m.privilege }
      link.to(Subjects.EdgeId(m.edge), Subjects.ConnId(m.conn)).send(
        gateway("system", { event: "welcome", participant, participants: participantsOf(topic), protocol: Mcpx.PROTOCOL }, { to: [m.participant] })
      )
      // A participant replacing its own older socket is one presence, not a leave and a join.
      if (previous === undefined) fanOut(topic, gateway("presence", { event: "join", participant }), m.participant)
      return
    }
    if (kind === Mcpx.TopicKind.leave) {
      const leave = leaveCodec.decode(body)
      if (Either.isLeft(leave)) return
      const m = topic.members.get(leave.right.participant)
      if (m === undefined || m.conn !== leave.right.conn) return // a replaced socket leaving
      topic.members.delete(m.participant)
      topic.everyone = undefined
      fanOut(topic, gateway("presence", { event: "leave", participant: { id: m.participant, privilege: m.privilege } }))
    }
  }

  /** Topics whose sequencer this replica is setting up; later joins wait for it. */
  const settingUp = new Map<string, Deferred.Deferred<void>>()

  /**
   * Makes sure someone sequences `topic` before a join is published to it. The sequencer
   * subscribes before it claims the topic, so once a claim is visible in KV its owner is already
   * listening; what arrives before the claim is decided waits, and is dropped if another replica won.
   */
  const ensureSequencer = (topic: string): Effect.Effect<void, Bus.BusError | Kv.KvConflict> => {
    if (sequenced.has(topic)) return Effect.void
    const inProgress = settingUp.get(topic)
    if (inProgress !== undefined) return Deferred.await(inProgress)
    const ready = Deferred.unsafeMake<void>(FiberId.none)
    settingUp.set(topic, ready)
    return setUp(topic).pipe(
      Effect.ensuring(
        Effect.sync(() => {
          settingUp.delete(topic)
          Deferred.unsafeDone(ready, Exit.void)
        })
      )
    )
  }

  const setUp = (topic: string) =>
    Effect.gen(function*() {
      const state: Topic = { name: topic, members: new Map(), history: yield* journal.open(config.history(topic)), everyone: undefined }
      const handle = onTopicMessage(state)
      let owner = false
      const early: Array<Bus.BusMessage> = []
      const subscription = yield* Scope.fork(scope, ExecutionStrategy.sequential)
      yield* bus.subscribe(Subjects.topic(topic), (m) => (owner ? handle(m) : void early.push(m))).pipe(Scope.extend(subscription))

      const key = Subjects.Key.topic(topic)
      const created = yield* Effect.either(claims.create(key, replica))
      if (Either.isLeft(created)) {
        const current = yield* claims.get(key)
        const holder = Option.map(current, (c) => decoder.decode(c.value))
        const alive = Option.isSome(holder)
          ? Option.isSome(yield* replicas.get(Subjects.Key.replica("broker", holder.value)))
          : false
        // Someone else sequences it, unless that replica is gone: then this one takes over, with
        // the members its predecessor had welcomed.
        const mine = Option.isSome(holder) && holder.value === replica
        const takeover = !mine && !alive && Option.isSome(current)
          ? Either.isRight(yield* Effect.either(claims.update(key, replica, current.value.revision)))
          : false
        if (!mine && !takeover) return yield* Scope.close(subscription, Exit.void)
        for (const { value } of yield* members.values(Subjects.Key.members(topic))) state.members.set(value.participant, value)
      }
      owner = true
      sequenced.set(topic, state)
      for (const m of early) handle(m)
    })

  // --- a participant's actor ---------------------------------------------------------------

  const participantActor = (conn: Actors.Connection) =>
    Effect.gen(function*() {
      const topic = conn.open.query["topic"]
      if (topic === undefined || topic === "") return yield* Effect.fail(new Actors.Refuse(CloseCode.PolicyViolation, "topic is required (?topic=)"))
      const token = conn.open.claims
      if (token === undefined) return yield* Effect.fail(new Actors.Refuse(CloseCode.PolicyViolation, "authentication required"))
      if (token.topics !== undefined && !token.topics.includes(topic)) {
        return yield* Effect.fail(new Actors.Refuse(CloseCode.PolicyViolation, `token is not valid for topic ${topic}`))
      }
      const id = token.sub
      const mode = config.topicModes.get(topic) ?? config.mode
      const saved = yield* members.get(Subjects.Key.member(topic, id)).pipe(Effect.orElseSucceed(() => Option.none()))
      // A promotion or demotion outlives the socket: a participant reconnecting keeps it.
      let privilege: Auth.Privilege = mode === "open"
        ? "full"
        : Option.isSome(saved) && saved.value.value.assigned === true
        ? saved.value.value.privilege
        : token.privilege ?? "restricted"
      const budget = new RateBudget(config.rate, config.burst)
      const chatBudget = new RateBudget(config.chatRate, config.chatBurst)
      const seen = new Set<string>()

      yield* ensureSequencer(topic).pipe(Effect.orDie)
      let member: Mcpx.Member = {
        topic,
        participant: id,
        privilege,
        conn: conn.id,
        edge: conn.edge,
        joinedAt: Date.now(),
        ...(Option.isSome(saved) && saved.value.value.assigned === true ? { assigned: true } : {})
      }
      // Last one wins: an older socket of the same participant is closed.
      if (Option.isSome(saved) && saved.value.value.conn !== conn.id) {
        link.close(Subjects.EdgeId(saved.value.value.edge), Subjects.ConnId(saved.value.value.conn), CloseCode.Normal, "replaced")
      }
      yield* members.put(Subjects.Key.member(topic, id), member).pipe(Effect.orDie)
      toTopic(topic, Mcpx.TopicKind.join, joinCodec.encode(member))

      const refuse = (code: Mcpx.ErrorCode, reason: string, correlation?: string) =>
        conn.send(gateway("system", { event: "error", code, reason }, { to: [id], ...(correlation === undefined ? {} : { correlation_id: correlation }) }))

      const onFrame = (frame: Actors.Frame): void => {
        let raw: unknown
        try {
          raw = JSON.parse(frame.text)
        } catch (e) {
          return refuse("invalid_envelope", `invalid JSON: ${e instanceof Error ? e.message : String(e)}`)
        }
        const correlation = isRecord(raw) && typeof raw["id"] === "string" ? raw["id"] : undefined
        if (frame.data.byteLength > config.maxEnvelope) {
          return refuse("too_large", `envelopes are limited to ${config.maxEnvelope} bytes`, correlation)
        }
        if (frame.limited || budget.take() !== "ok") {
          return refuse("rate_limited", `rate limit exceeded (${config.rate}/s, burst ${config.burst})`, correlation)
        }
        const decoded = decodeEnvelope(raw)
        if (Either.isLeft(decoded)) {
          return refuse("invalid_envelope", ParseResult.TreeFormatter.formatErrorSync(decoded.left), correlation)
        }
        const envelope = decoded.right
        if (envelope.kind === "chat" && chatBudget.take() !== "ok") {
          return refuse("rate_limited", `chat rate limit exceeded (${config.chatRate}/s, burst ${config.chatBurst})`, envelope.id)
        }
        if (envelope.from !== id) return refuse("spoofed_from", `from must be your participant id (${id})`, envelope.id)
        if (envelope.kind === "system") return refuse("forbidden_kind", "only the gateway sends system messages", envelope.id)
        if (seen.has(envelope.id)) return refuse("duplicate_id", `envelope id ${envelope.id} was already used`, envelope.id)
        seen.add(envelope.id)
        if (seen.size > REMEMBERED_IDS) seen.delete(seen.values().next().value as string)
        if (envelope.kind === "mcp" && privilege === "restricted") {
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
        const traced = Option.isSome(tracer)
          ? Telemetry.startSpan(tracer.value, `broker.accept ${envelope.kind}`, frame.traceparent, {
            kind: SpanKind.CONSUMER,
            attributes: { "mcpx.topic": topic, "mcpx.envelope.id": envelope.id, "mcpx.from": id, "sb.conn": conn.id }
          })
          : undefined
        // Stamp ts when missing; otherwise the envelope travels exactly as it was sent.
        toTopic(
          topic,
          Mcpx.TopicKind.envelope,
          envelope.ts === undefined ? JSON.stringify({ ...(raw as object), ts: now() }) : frame.text,
          traced?.traceparent
        )
        traced?.span.end()
      }

      const onClosed = () =>
        Effect.gen(function*() {
          toTopic(topic, Mcpx.TopicKind.leave, leaveCodec.encode({ participant: id, conn: conn.id }))
          const current = yield* members.get(Subjects.Key.member(topic, id))
          if (Option.isSome(current) && current.value.value.conn === conn.id) yield* members.delete(Subjects.Key.member(topic, id))
        }).pipe(Effect.ignore)

      /** An admin changed this participant's privilege (the KV record is already updated). */
      const onPeer = (message: Bus.BusMessage) => {
        if (message.header(Subjects.Header.kind) !== AdminApi.PRIVILEGE) return
        const next = Bus.text(message) === "full" ? "full" : "restricted"
        privilege = next
        member = { ...member, privilege: next, assigned: true }
        toTopic(topic, Mcpx.TopicKind.join, joinCodec.encode(member))
        conn.send(gateway("system", { event: "privilege", participant: { id, privilege: next } }, { to: [id] }))
      }

      return { onFrame, onPeer, onClosed } satisfies Actors.Actor
    })

  yield* Actors.host({ service: "broker", replica, replicaHeartbeat: config.replicaHeartbeat, make: participantActor })
})

export const layer = Layer.merge(Layer.scopedDiscard(make), AdminApi.layer)
