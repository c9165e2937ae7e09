/**
 * The MCPx v0.1 topic broker. Each socket is a participant actor, admitted here and run by
 * `Participant.ts`: it checks every envelope (shape, `from`, duplicate ids, privilege, size and
 * rate) and appends the accepted ones to the topic's history, an acknowledged append whose final
 * failure the sender hears of. The history's order is the topic's total order. One sequencer per
 * topic, claimed in KV, follows the topic's history and fans each envelope out with one publish
 * per edge that has members; joins and leaves reach it on the topic's subject. A sequencer that
 * takes over replays the history from the last sequence its predecessor recorded, so an envelope
 * stored while nobody sequenced is not lost.
 */
import { Actors, Bus, Journal, Kv, Liveness, Peer, Subjects } from "@switchboard/bus"
import { type Auth, Edge, Mcpx } from "@switchboard/protocol"
import * as Deferred from "effect/Deferred"
import { SpanKind } from "@opentelemetry/api"
import { Telemetry } from "@switchboard/telemetry"
import * as Effect from "effect/Effect"
import * as ExecutionStrategy from "effect/ExecutionStrategy"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as FiberId from "effect/FiberId"
import * as FiberSet from "effect/FiberSet"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import * as AdminApi from "./AdminApi.ts"
import { gateway, Participant, type Room } from "./Participant.ts"
import * as BrokerConfig from "./Config.ts"

const CloseCode = Edge.CloseCode
const decoder = new TextDecoder()
/** What reaches a topic's sequencer on its subject, besides the history. */
const topicEvents = Peer.protocol(Mcpx.TopicEvent)
/** What one broker replica asks another: to take a topic on. */
const brokerPeers = Peer.protocol(Mcpx.BrokerPeer)

/**
 * How long a sequencer that gave up its claim still listens before it lets go of the topic: a
 * participant that saw the claim just before it went publishes its join a KV round trip later,
 * and that join has to win the claim back rather than be lost.
 */
const RELEASE_GRACE = "1 second"

/**
 * How often a sequencer records the last history sequence it sent out. A sequencer that dies
 * without a word leaves its successor to replay from the last record, so members may get the
 * envelopes of up to this long before the death twice (same envelope id); one KV write per busy
 * topic per interval keeps the cost off the per-envelope path.
 */
const RECORD_DELIVERED = "250 millis"

/**
 * How long a stopping replica waits for another to take one of its topics, and for that one's
 * marker; and how long the new sequencer waits for what the old one forwards before it goes on
 * without (the old one died meanwhile). Well within the replica's hand-off grace.
 */
const TRANSFER_TIMEOUT = "3 seconds"

/**
 * A topic changing hands between replicas: the old sequencer keeps what reached it before the new
 * one's marker (`before`) to forward, and what came after (`after`) in case the hand-off fails.
 */
interface Transfer {
  readonly token: string
  marked: boolean
  readonly markerReached: Deferred.Deferred<void>
  readonly after: Array<Bus.BusMessage>
}

/**
 * The sequencer of one topic: its members by participant id, in join order. An owner sequences;
 * a `releasing` one has given up its claim after the topic stayed empty and holds what arrives
 * until it wins the claim back; a `handing-on` one passes what arrives to the new owner. When a
 * replica stops, its sequencer is `transferring` the topic to one that is `receiving` it.
 */
interface Topic {
  readonly name: string
  readonly members: Map<string, Mcpx.Member>
  /** The last history sequence sent out, and the last one recorded in KV. */
  delivered: number
  recorded: number
  /** One handle per edge with members, rebuilt only when membership changes. */
  everyone: ReadonlyArray<Actors.Socket> | undefined
  /** The topic's bus subscription; closing it lets go of the topic. */
  readonly subscription: Scope.CloseableScope
  phase: "owner" | "releasing" | "handing-on" | "transferring" | "receiving"
  transfer: Transfer | undefined
  /** Runs out when the topic has been empty for MCPX_TOPIC_IDLE. */
  idle: Fiber.RuntimeFiber<void> | undefined
  /** Done when a release ends, either way; joins on this replica wait for it. */
  released: Deferred.Deferred<void> | undefined
  /** What arrived while releasing: on the topic's subject, and in its history. */
  readonly held: Array<Bus.BusMessage>
  readonly heldEntries: Array<Journal.JournalEntry>
  reclaiming: boolean
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
    topicIdle: yield* BrokerConfig.topicIdle,
    replicaHeartbeat: yield* BrokerConfig.replicaHeartbeat
  }
  if (Option.isSome(yield* BrokerConfig.removedHistoryBytes)) {
    yield* Effect.logWarning("MCPX_HISTORY_BYTES is no longer used: MCPX_HISTORY_LIMIT bounds each topic's history, MCPX_HISTORY_TOTAL_BYTES all of them")
  }
  const history = yield* (yield* Journal.Journal).open(config.history)
  const claims = yield* kv.bucket(Subjects.Bucket.topics)
  const replicas = yield* kv.bucket(Subjects.Bucket.replicas)
  const members = Kv.typed(yield* kv.bucket(Subjects.Bucket.members), Mcpx.Member)
  const replica = randomUUID()
  // The sequencers' subscriptions live in a scope of their own, closed after the actor host's
  // hand-off: a child of the layer's scope forked later would close before it, and a stopping
  // replica would have no sequencer left to hand on.
  const scope = yield* Effect.acquireRelease(Scope.make(), (s) => Scope.close(s, Exit.void))
  /** Topics this replica sequences. */
  const sequenced = new Map<string, Topic>()
  /** This replica stops: it takes on no topic, and hands its own on. */
  let stopping = false
  const fibers = yield* FiberSet.make()
  const run = yield* FiberSet.runtime(fibers)<never>()

  const toTopic = (topic: string, event: Peer.Tell<Mcpx.TopicEvent>, traceparent?: string) =>
    topicEvents.publish(bus, Subjects.topic(topic), event, traceparent)
  /** A message on a topic's subject, typed; one that does not decode is logged and dropped. */
  const topicEvent = (message: Bus.BusMessage): Mcpx.TopicEvent | undefined => {
    const event = topicEvents.decode(message)
    if (Either.isRight(event)) return event.right
    run(Effect.logWarning(`dropped a message on ${message.subject}: ${event.left}`))
  }
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

  /** An envelope stored in the topic's history goes out to every member, the sender included. */
  const deliver = (topic: Topic, entry: Journal.JournalEntry) => {
    const traced = Option.isSome(tracer)
      ? Telemetry.startSpan(tracer.value, "broker.fanout", entry.traceparent, {
        kind: SpanKind.PRODUCER,
        attributes: { "mcpx.topic": topic.name, "mcpx.members": topic.members.size, "mcpx.seq": entry.seq }
      })
      : undefined
    fanOut(topic, entry.data, undefined, traced?.traceparent)
    topic.delivered = entry.seq
    traced?.span.end()
  }

  /** What the sequencer does with a history entry, by its phase. */
  const onEntry = (topic: Topic) => (entry: Journal.JournalEntry) => {
    if (topic.phase === "owner") return deliver(topic, entry)
    // Handing on: the new owner replays from the sequence recorded when this one let go.
    if (topic.phase === "handing-on") return
    topic.heldEntries.push(entry)
    if (topic.phase === "releasing" && !topic.reclaiming) run(reclaim(topic))
  }

  const onTopicMessage = (topic: Topic) => {
    const handle = onTopicEvent(topic)
    return (message: Bus.BusMessage) => {
      const event = topicEvent(message)
      if (event?._tag === "TopicJoin" || event?._tag === "TopicLeave") handle(event)
    }
  }

  const onTopicEvent = (topic: Topic) => (event: Mcpx.TopicJoin | Mcpx.TopicLeave) => {
    if (event._tag === "TopicJoin") {
      const m = event.member
      if (topic.idle !== undefined) {
        topic.idle.unsafeInterruptAsFork(FiberId.none)
        topic.idle = undefined
      }
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
    const m = topic.members.get(event.participant)
    if (m === undefined || m.conn !== event.conn) return // a replaced socket leaving
    topic.members.delete(m.participant)
    topic.everyone = undefined
    fanOut(topic, gateway("presence", { event: "leave", participant: { id: m.participant, privilege: m.privilege } }))
    idleWhenEmpty(topic)
  }

  // --- letting go of a topic nobody is in ----------------------------------------------------
  //
  // A topic's sequencer costs a subscription, a claim in KV and its state, for as long as the
  // replica runs; topics are as many as names anyone joins. Once a topic has been empty for
  // MCPX_TOPIC_IDLE, its sequencer gives up its claim and, after RELEASE_GRACE, the rest. The
  // history stays in the journal, and the next join sets a sequencer up again.

  const idleWhenEmpty = (topic: Topic) => {
    if (topic.members.size > 0 || topic.idle !== undefined || topic.phase !== "owner") return
    topic.idle = run(Effect.zipRight(Effect.sleep(config.topicIdle), release(topic)))
  }

  /** Passes a message on to the topic's new owner, as it came. */
  const handOn = (topic: Topic, message: Bus.BusMessage) => {
    const event = topicEvent(message)
    if (event !== undefined) toTopic(topic.name, event, message.header(Subjects.Header.traceparent))
  }

  const releaseEnded = (topic: Topic) => {
    if (topic.released !== undefined) Deferred.unsafeDone(topic.released, Exit.void)
    topic.released = undefined
  }

  /** The topic is this replica's again: what was held is handled in the order it came. */
  const resume = (topic: Topic) =>
    Effect.sync(() => {
      topic.phase = "owner"
      topic.transfer = undefined
      topic.reclaiming = false
      const handle = onTopicMessage(topic)
      for (const m of topic.held.splice(0)) handle(m)
      for (const e of topic.heldEntries.splice(0)) deliver(topic, e)
      releaseEnded(topic)
      idleWhenEmpty(topic)
    })

  const letGo = (topic: Topic) =>
    Effect.gen(function*() {
      topic.phase = "handing-on"
      for (const m of topic.held.splice(0)) handOn(topic, m)
      // Not sent out here: the recorded sequence is before them, so the new owner replays them.
      topic.heldEntries.length = 0
      if (sequenced.get(topic.name) === topic) sequenced.delete(topic.name)
      yield* Scope.close(topic.subscription, Exit.void)
      releaseEnded(topic)
    })

  /** Something arrived after the claim was given up: win it back, or hand it to whoever has it. */
  const reclaim = (topic: Topic) => {
    topic.reclaiming = true
    return claims.create(Subjects.Key.topic(topic.name), replica).pipe(
      Effect.matchCauseEffect({
        onSuccess: () => resume(topic),
        onFailure: (cause) =>
          Effect.zipRight(
            Effect.logDebug(`topic ${topic.name} was claimed by another replica meanwhile`, cause),
            letGo(topic)
          )
      })
    )
  }

  const release = (topic: Topic) =>
    Effect.gen(function*() {
      topic.idle = undefined
      if (topic.members.size > 0 || topic.phase !== "owner") return
      const key = Subjects.Key.topic(topic.name)
      const current = yield* claims.get(key)
      // Taken over by a replica that thought this one gone: it is not ours to give up.
      if (Option.isNone(current) || decoder.decode(current.value.value) !== replica) return yield* letGo(topic)
      yield* recordDelivered(topic)
      // Only the claim that was read: one taken over meanwhile is the other replica's now.
      const takenOver = yield* claims.compareAndDelete(key, current.value.revision).pipe(
        Effect.as(false),
        Effect.catchTag("KvConflict", () => Effect.succeed(true))
      )
      if (takenOver) return yield* letGo(topic)
      topic.phase = "releasing"
      topic.released = Deferred.unsafeMake<void>(FiberId.none)
      // Someone joined while the claim was being given up.
      if (topic.members.size > 0) return yield* reclaim(topic)
      yield* Effect.sleep(RELEASE_GRACE)
      if (topic.phase === "releasing" && !topic.reclaiming) yield* letGo(topic)
    }).pipe(
      Effect.catchAll((e) =>
        Effect.zipRight(Effect.logWarning(`could not release topic ${topic.name}; it stays set up`, e), resume(topic))
      )
    )

  /** What the topic's subscription does with a message, by the sequencer's phase. */
  const dispatch = (topic: Topic) => {
    const handle = onTopicMessage(topic)
    return (message: Bus.BusMessage) => {
      if (topic.phase === "owner") return handle(message)
      if (topic.phase === "handing-on") return handOn(topic, message)
      if (topic.transfer !== undefined) return onTransferMessage(topic, topic.transfer, message)
      topic.held.push(message)
      if (!topic.reclaiming) run(reclaim(topic))
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
    const current = sequenced.get(topic)
    // Being let go of: set up again (or found won back) once that is over.
    if (current?.released !== undefined) return Effect.zipRight(Deferred.await(current.released), Effect.suspend(() => ensureSequencer(topic)))
    if (current !== undefined) return Effect.void
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
      const subscription = yield* Scope.fork(scope, ExecutionStrategy.sequential)
      const state: Topic = {
        name: topic,
        members: new Map(),
        delivered: 0,
        recorded: 0,
        everyone: undefined,
        subscription,
        phase: "owner",
        transfer: undefined,
        idle: undefined,
        released: undefined,
        held: [],
        heldEntries: [],
        reclaiming: false
      }
      const handle = dispatch(state)
      let owner = false
      const early: Array<Bus.BusMessage> = []
      yield* bus.subscribe(Subjects.topic(topic), (m) => (owner ? handle(m) : void early.push(m))).pipe(Scope.extend(subscription))

      const key = Subjects.Key.topic(topic)
      const created = yield* Effect.either(claims.create(key, replica))
      if (Either.isLeft(created)) {
        const current = yield* claims.get(key)
        const holder = Option.map(current, (c) => decoder.decode(c.value))
        // A holder whose key lapsed (its heartbeat writes failed through a NATS election) may still
        // sequence: it is asked before the topic is taken from it, or the topic would have two.
        const alive = Option.isSome(holder)
          ? Option.isSome(yield* replicas.get(Subjects.Key.replica("broker", holder.value))) || (yield* Liveness.answers(bus, "broker", holder.value))
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
      // The topic is ours from here: whatever is in its history after the last sequence anyone sent
      // out (a predecessor that died, or let go) is sent out now, then each new envelope. A recorded
      // sequence past the history's end is from a history since removed.
      // (Round trips side by side: the first join of a topic waits for them.)
      const [next, found] = yield* Effect.all([history.nextSeq, claims.get(Subjects.Key.topicDelivered(topic))], { concurrency: 2 })
      const recorded = Option.flatMap(found, (e) => {
        const seq = Number(decoder.decode(e.value))
        return Number.isSafeInteger(seq) && seq >= 0 && seq < next ? Option.some(seq) : Option.none()
      })
      state.delivered = state.recorded = Option.getOrElse(recorded, () => next - 1)
      yield* Effect.all([
        // Recorded at once, so a successor after an early crash replays from here, not from its own start.
        Option.isNone(recorded) ? claims.put(Subjects.Key.topicDelivered(topic), String(state.recorded)) : Effect.void,
        history.follow(Subjects.historyKey(topic), { from: state.delivered + 1 }, onEntry(state)).pipe(Scope.extend(subscription))
      ], { concurrency: 2, discard: true })
      owner = true
      sequenced.set(topic, state)
      for (const m of early) handle(m)
      // A participant that never gets as far as its join leaves the topic empty from the start.
      idleWhenEmpty(state)
    })

  // --- recording what was sent out, and taking over from a sequencer that died ---------------

  const recordDelivered = (topic: Topic) =>
    Effect.suspend(() => {
      const seq = topic.delivered
      if (seq <= topic.recorded) return Effect.void
      return Effect.map(claims.put(Subjects.Key.topicDelivered(topic.name), String(seq)), () => {
        topic.recorded = Math.max(topic.recorded, seq)
      })
    })

  yield* Effect.suspend(() =>
    Effect.forEach(
      [...sequenced.values()].filter((t) => t.phase === "owner"),
      (t) => recordDelivered(t).pipe(Effect.catchAll((e) => Effect.logWarning(`could not record what topic ${t.name} sent out`, e))),
      { discard: true }
    )
  ).pipe(Effect.repeat(Schedule.spaced(RECORD_DELIVERED)), Effect.forkScoped)

  /** Topics with participants whose actors live here, and how many. */
  const localTopics = new Map<string, number>()
  /**
   * A sequencer's replica that dies leaves its topic to whoever notices: an adopted participant
   * actor's join does, but when every participant's actor lives elsewhere nothing would. So once a
   * broker replica lapses, each replica makes sure its participants' topics are sequenced, taking
   * over those whose holder is gone.
   */
  let aliveBrokers: ReadonlySet<string> | undefined
  yield* Effect.gen(function*() {
    const alive = new Set(yield* replicas.keys(Subjects.Key.replicas("broker")))
    const lapsed = aliveBrokers !== undefined && [...aliveBrokers].some((r) => !alive.has(r))
    aliveBrokers = alive
    if (!lapsed || stopping) return
    for (const topic of localTopics.keys()) {
      if (!sequenced.has(topic)) yield* ensureSequencer(topic).pipe(Effect.catchAll((e) => Effect.logWarning(`could not take topic ${topic} over`, e)))
    }
  }).pipe(
    Effect.catchAll((e) => Effect.logWarning("sequencer sweep failed", e)),
    Effect.repeat(Schedule.spaced(config.replicaHeartbeat)),
    Effect.forkScoped
  )

  // --- handing topics on when this replica stops ----------------------------------------------
  //
  // Joins and leaves reach a sequencer by plain publishes on the topic's subject, so a topic
  // changes hands with both sequencers listening for a moment. The new one publishes a marker
  // there: what the old one received before it, the old one forwards (the new one was not yet
  // sure to hear it); what came after, the new one heard itself. It handles the forwarded share
  // first, then its own, and sends out the history from the sequence the old one last sent, so
  // no member misses an envelope or gets one twice. The topics go before the participants' actors
  // do (`beforeHandoff`): a handed-over participant joins a sequencer that stays.

  const onTransferMessage = (topic: Topic, transfer: Transfer, message: Bus.BusMessage) => {
    const event = topicEvent(message)
    if (event === undefined) return
    if (event._tag === "TopicMarker") {
      if (event.token === transfer.token) {
        transfer.marked = true
        Deferred.unsafeDone(transfer.markerReached, Exit.void)
      }
      return
    }
    if (topic.phase === "transferring") return void (transfer.marked ? transfer.after : topic.held).push(message)
    // Receiving: the old sequencer's share comes forwarded, before the end of it.
    if (event._tag === "TopicForwarded") return onTopicEvent(topic)(event.event)
    if (event._tag === "TopicForwardEnd") {
      if (event.token === transfer.token) run(resume(topic))
      return
    }
    // Before the marker, it reached the old sequencer too, which forwards it.
    if (transfer.marked) topic.held.push(message)
  }

  /** Hands one topic this replica sequences to another replica; keeps it when none takes it. */
  const transferTopic = (topic: Topic) =>
    Effect.gen(function*() {
      if (topic.phase !== "owner") return
      if (topic.idle !== undefined) {
        topic.idle.unsafeInterruptAsFork(FiberId.none)
        topic.idle = undefined
      }
      const transfer: Transfer = { token: randomUUID(), marked: false, markerReached: Deferred.unsafeMake(FiberId.none), after: [] }
      topic.transfer = transfer
      topic.phase = "transferring"
      // Nothing goes out from here on: the new sequencer starts right after this sequence.
      const delivered = topic.delivered
      const request = new Mcpx.TopicHandoff({ topic: topic.name, from: replica, token: transfer.token, delivered, members: [...topic.members.values()] })
      const taken = yield* recordDelivered(topic).pipe(
        Effect.zipRight(brokerPeers.callOn(bus, Subjects.topicHandoff, request, { timeout: TRANSFER_TIMEOUT })),
        Effect.as(true),
        Effect.catchTag("TopicHandoffRefused", () => Effect.succeed(false)),
        Effect.catchAll(() =>
          // No answer may still mean it was taken: the claim says.
          claims.get(Subjects.Key.topic(topic.name)).pipe(
            Effect.map((c) => Option.isSome(c) && decoder.decode(c.value.value) !== replica),
            Effect.orElseSucceed(() => false)
          )
        )
      )
      if (!taken) {
        topic.held.push(...transfer.after)
        return yield* resume(topic)
      }
      yield* Deferred.await(transfer.markerReached).pipe(Effect.timeout(TRANSFER_TIMEOUT), Effect.ignore)
      yield* Scope.close(topic.subscription, Exit.void)
      for (const m of topic.held.splice(0)) {
        const event = topicEvent(m)
        if (event?._tag === "TopicJoin" || event?._tag === "TopicLeave") toTopic(topic.name, new Mcpx.TopicForwarded({ event }))
      }
      toTopic(topic.name, new Mcpx.TopicForwardEnd({ token: transfer.token }))
      topic.phase = "handing-on"
      topic.heldEntries.length = 0
      if (sequenced.get(topic.name) === topic) sequenced.delete(topic.name)
    }).pipe(Effect.catchAllCause((cause) => Effect.logWarning(`could not hand topic ${topic.name} on`, cause)))

  /** Takes a topic on from a stopping replica, at its request. */
  const receiveTopic = (request: Mcpx.TopicHandoff) =>
    Effect.gen(function*() {
      const { topic } = request
      if (stopping) return yield* new Mcpx.TopicHandoffRefused({ reason: "this replica stops too" })
      for (let pending = settingUp.get(topic); pending !== undefined; pending = settingUp.get(topic)) yield* Deferred.await(pending)
      if (sequenced.has(topic)) return yield* new Mcpx.TopicHandoffRefused({ reason: "this replica has the topic set up already" })
      // A participant joining here meanwhile waits for this, as for any set-up: it must not set
      // up a second sequencer on finding the claim already this replica's.
      const ready = Deferred.unsafeMake<void>(FiberId.none)
      settingUp.set(topic, ready)
      const done = Effect.sync(() => {
        if (settingUp.get(topic) === ready) settingUp.delete(topic)
        Deferred.unsafeDone(ready, Exit.void)
      })
      const subscription = yield* Scope.fork(scope, ExecutionStrategy.sequential)
      const state: Topic = {
        name: topic,
        members: new Map(request.members.map((m) => [m.participant, m])),
        delivered: request.delivered,
        recorded: request.delivered,
        everyone: undefined,
        subscription,
        phase: "receiving",
        transfer: { token: request.token, marked: false, markerReached: Deferred.unsafeMake(FiberId.none), after: [] },
        idle: undefined,
        released: undefined,
        held: [],
        heldEntries: [],
        reclaiming: false
      }
      return yield* Effect.gen(function*() {
        yield* bus.subscribe(Subjects.topic(topic), dispatch(state)).pipe(Scope.extend(subscription))
        yield* bus.flush
        toTopic(topic, new Mcpx.TopicMarker({ token: request.token }))
        const key = Subjects.Key.topic(topic)
        const current = yield* claims.get(key)
        if (Option.isNone(current) || decoder.decode(current.value.value) !== request.from) {
          yield* Scope.close(subscription, Exit.void)
          return yield* new Mcpx.TopicHandoffRefused({ reason: "the topic is not the asking replica's" })
        }
        yield* claims.update(key, replica, current.value.revision)
        yield* history.follow(Subjects.historyKey(topic), { from: request.delivered + 1 }, onEntry(state)).pipe(Scope.extend(subscription))
        sequenced.set(topic, state)
        // An old sequencer that dies before it forwarded everything must not leave the topic held.
        run(Effect.sleep(TRANSFER_TIMEOUT).pipe(Effect.zipRight(Effect.suspend(() => (state.phase === "receiving" ? resume(state) : Effect.void)))))
        return { replica }
      }).pipe(Effect.onError(() => Scope.close(subscription, Exit.void)), Effect.ensuring(done))
    })

  /** Hand-off requests from stopping replicas; this replica stops taking them when it stops itself. */
  const topicIntake = yield* Effect.acquireRelease(Scope.make(), (s) => Scope.close(s, Exit.void))
  const handoffs = yield* brokerPeers.serve(Subjects.topicHandoff, (message, reply) =>
    receiveTopic(message).pipe(
      Effect.mapError((e) => (e._tag === "TopicHandoffRefused" ? e : new Mcpx.TopicHandoffRefused({ reason: `could not take the topic on: ${e.message}` }))),
      Effect.exit,
      Effect.flatMap(reply(message).complete)
    ), { queue: Subjects.Queue.service("broker") }).pipe(Effect.provideService(Bus.Bus, bus), Scope.extend(topicIntake))

  /** Runs once this replica takes no new participants, before its participants' actors move. */
  const handTopicsOn = Effect.gen(function*() {
    stopping = true
    yield* handoffs.drain
    yield* Effect.forEach([...settingUp.values()], Deferred.await, { discard: true })
    const topics = [...sequenced.values()]
    yield* Effect.forEach(topics, transferTopic, { concurrency: 64, discard: true })
    const kept = topics.filter((t) => sequenced.get(t.name) === t).length
    if (kept > 0) yield* Effect.logWarning(`kept ${kept} of ${topics.length} topics: no other replica took them; they are taken over once this one is gone`)
    else if (topics.length > 0) yield* Effect.logInfo(`handed ${topics.length} topics on to other replicas`)
  }).pipe(
    Effect.timeout("8 seconds"),
    Effect.ignore,
    // The host runs this in a finalizer, uninterruptibly (on SIGTERM its fiber is being
    // interrupted): on a fiber of its own, the timeouts above can still cut waits short.
    Effect.interruptible,
    Effect.forkDaemon,
    Effect.flatMap(Fiber.join)
  )

  // --- a participant's actor ---------------------------------------------------------------

  const room: Room = { config, history, members, tracer, toTopic }

  const participantActor = (conn: Actors.Connection, restored: boolean) =>
    Effect.gen(function*() {
      const topic = conn.open.query["topic"]
      if (topic === undefined || topic === "") return yield* Effect.fail(new Actors.Refuse(CloseCode.PolicyViolation, "topic is required (?topic=)"))
      if (topic.length > Mcpx.MAX_TOPIC_LENGTH) {
        return yield* Effect.fail(new Actors.Refuse(CloseCode.PolicyViolation, `topic names are limited to ${Mcpx.MAX_TOPIC_LENGTH} characters`))
      }
      const token = conn.open.claims
      if (token === undefined) return yield* Effect.fail(new Actors.Refuse(CloseCode.PolicyViolation, "authentication required"))
      // Whoever joins as `system:…` would speak with the gateway's voice.
      if (Mcpx.isReserved(token.sub)) {
        return yield* Effect.fail(
          new Actors.Refuse(CloseCode.PolicyViolation, `participant ids starting with ${Mcpx.RESERVED_PREFIX} are reserved for the gateway`)
        )
      }
      if (token.sub.length > Mcpx.MAX_ID_LENGTH) {
        return yield* Effect.fail(new Actors.Refuse(CloseCode.PolicyViolation, `participant ids are limited to ${Mcpx.MAX_ID_LENGTH} characters`))
      }
      if (token.topics !== undefined && !token.topics.includes(topic)) {
        return yield* Effect.fail(new Actors.Refuse(CloseCode.PolicyViolation, `token is not valid for topic ${topic}`))
      }
      const id = token.sub
      const mode = config.topicModes.get(topic) ?? config.mode
      const saved = yield* members.get(Subjects.Key.member(topic, id)).pipe(Effect.orElseSucceed(() => Option.none()))
      // Moved here (hand-off or adoption) after a newer socket of the same participant joined: that
      // one won while this actor was between replicas. Taking the membership back would close the
      // newer socket, maybe before its welcome, and leave the participant with a socket it closed.
      if (restored && Option.isSome(saved) && saved.value.value.conn !== conn.id) {
        conn.close(CloseCode.Normal, "replaced")
        return { onFrame: () => {} } satisfies Actors.Actor
      }
      // A promotion or demotion outlives the socket: a participant reconnecting keeps it.
      const privilege: Auth.Privilege = mode === "open"
        ? "full"
        : Option.isSome(saved) && saved.value.value.assigned === true
        ? saved.value.value.privilege
        : token.privilege ?? "restricted"
      yield* ensureSequencer(topic).pipe(Effect.orDie)
      localTopics.set(topic, (localTopics.get(topic) ?? 0) + 1)
      yield* Effect.addFinalizer(() =>
        Effect.sync(() => {
          const n = (localTopics.get(topic) ?? 1) - 1
          if (n > 0) localTopics.set(topic, n)
          else localTopics.delete(topic)
        })
      )
      const member: Mcpx.Member = {
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
      toTopic(topic, new Mcpx.TopicJoin({ member }))

      return new Participant(room, conn, topic, id, member)
    })

  yield* Actors.host({
    service: "broker",
    replica,
    replicaHeartbeat: config.replicaHeartbeat,
    protocol: AdminApi.participantPeers,
    make: participantActor,
    beforeHandoff: handTopicsOn
  })
})

export const layer = Layer.merge(Layer.scopedDiscard(make), AdminApi.layer)
