/**
 * Handing topics on when a broker replica stops. Joins and leaves reach a sequencer by plain
 * publishes on the topic's subject, so a topic changes hands with both sequencers listening for a
 * moment. The new one publishes a marker there: what the old one received before it, the old one
 * forwards (the new one was not yet sure to hear it); what came after, the new one heard itself.
 * It handles the forwarded share first, then its own, and sends out the history from the sequence
 * the old one last sent, so no member misses an envelope or gets one twice. The topics go before
 * the participants' actors do (`beforeHandoff`): a handed-over participant joins a sequencer that
 * stays.
 */
import { Bus, Peer, Subjects } from "@switchboard/bus"
import { Mcpx } from "@switchboard/protocol"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as FiberId from "effect/FiberId"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import { forget, holderOf, type Replica } from "./Replica.ts"
import type { Sequencers } from "./Sequencers.ts"
import type { TopicSequencer } from "./TopicSequencer.ts"

/** What one broker replica asks another: to take a topic on. */
const brokerPeers = Peer.protocol(Mcpx.BrokerPeer)

/**
 * How long a stopping replica waits for another to take one of its topics, and for that one's
 * marker; and how long the new sequencer waits for what the old one forwards before it goes on
 * without (the old one died meanwhile). Well within the replica's hand-off grace.
 */
const TRANSFER_TIMEOUT = "3 seconds"

/**
 * A topic changing hands between replicas, on either side: the old sequencer keeps what reached it
 * before the new one's marker (its `held`) to forward, and what came after (`after`) in case the
 * hand-off fails; the new one handles the forwarded share, and holds its own until the end of it.
 */
export class Transfer {
  marked = false
  readonly markerReached = Deferred.unsafeMake<void>(FiberId.none)
  readonly after: Array<Bus.BusMessage> = []

  constructor(readonly token: string) {}

  /** A message on the topic's subject while the topic is `transferring` or `receiving`. */
  onMessage(topic: TopicSequencer, message: Bus.BusMessage): void {
    const event = topic.event(message)
    if (event === undefined) return
    if (event._tag === "TopicMarker") {
      if (event.token === this.token) {
        this.marked = true
        Deferred.unsafeDone(this.markerReached, Exit.void)
      }
      return
    }
    if (topic.phase === "transferring") return void (this.marked ? this.after : topic.held).push(message)
    // Receiving: the old sequencer's share comes forwarded, before the end of it.
    if (event._tag === "TopicForwarded") return topic.onEvent(event.event)
    if (event._tag === "TopicForwardEnd") {
      if (event.token === this.token) topic.resumeSoon()
      return
    }
    // Before the marker, it reached the old sequencer too, which forwards it.
    if (this.marked) topic.held.push(message)
  }
}

/** Serves other replicas' hand-offs until this one stops; returns what hands this replica's topics on. */
export const make = (replica: Replica, sequencers: Sequencers) =>
  Effect.gen(function*() {
    const { bus, claims, sequenced, settingUp, toTopic } = replica

    /** Hands one topic this replica sequences to another replica; keeps it when none takes it. */
    const transferTopic = (topic: TopicSequencer) =>
      Effect.gen(function*() {
        if (topic.phase !== "owner") return
        topic.stopIdle()
        const transfer = new Transfer(randomUUID())
        topic.transfer = transfer
        topic.phase = "transferring"
        // Nothing goes out from here on: the new sequencer starts right after this sequence.
        const delivered = topic.delivered
        const request = new Mcpx.TopicHandoff({ topic: topic.name, from: replica.id, token: transfer.token, delivered, members: [...topic.members.values()] })
        const taken = yield* topic.recordDelivered.pipe(
          Effect.zipRight(brokerPeers.callOn(bus, Subjects.topicHandoff, request, { timeout: TRANSFER_TIMEOUT })),
          Effect.as(true),
          Effect.catchTag("TopicHandoffRefused", () => Effect.succeed(false)),
          Effect.catchAll(() =>
            // No answer may still mean it was taken: the claim says.
            claims.get(Subjects.Key.topic(topic.name)).pipe(
              Effect.map((c) => Option.isSome(c) && holderOf(c.value.value) !== replica.id),
              Effect.orElseSucceed(() => false)
            )
          )
        )
        if (!taken) {
          topic.held.push(...transfer.after)
          return yield* topic.resume
        }
        yield* Deferred.await(transfer.markerReached).pipe(Effect.timeout(TRANSFER_TIMEOUT), Effect.ignore)
        yield* Scope.close(topic.subscription, Exit.void)
        for (const m of topic.held.splice(0)) {
          const event = topic.event(m)
          if (event?._tag === "TopicJoin" || event?._tag === "TopicLeave") toTopic(topic.name, new Mcpx.TopicForwarded({ event }))
        }
        toTopic(topic.name, new Mcpx.TopicForwardEnd({ token: transfer.token }))
        topic.phase = "handing-on"
        topic.heldEntries.length = 0
        forget(replica, topic)
      }).pipe(Effect.catchAllCause((cause) => Effect.logWarning(`could not hand topic ${topic.name} on`, cause)))

    /** Takes a topic on from a stopping replica, at its request. */
    const receiveTopic = (request: Mcpx.TopicHandoff) =>
      Effect.gen(function*() {
        const { topic } = request
        if (replica.stopping) return yield* new Mcpx.TopicHandoffRefused({ reason: "this replica stops too" })
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
        const state = yield* sequencers.create(topic, {
          members: request.members,
          delivered: request.delivered,
          phase: "receiving",
          transfer: new Transfer(request.token)
        })
        const { subscription } = state
        return yield* Effect.gen(function*() {
          yield* bus.subscribe(Subjects.topic(topic), state.onMessage).pipe(Scope.extend(subscription))
          yield* bus.flush
          toTopic(topic, new Mcpx.TopicMarker({ token: request.token }))
          const key = Subjects.Key.topic(topic)
          const current = yield* claims.get(key)
          if (Option.isNone(current) || holderOf(current.value.value) !== request.from) {
            yield* Scope.close(subscription, Exit.void)
            return yield* new Mcpx.TopicHandoffRefused({ reason: "the topic is not the asking replica's" })
          }
          yield* claims.update(key, replica.id, current.value.revision)
          yield* replica.history.follow(Subjects.historyKey(topic), { from: request.delivered + 1 }, state.onEntry).pipe(Scope.extend(subscription))
          sequenced.set(topic, state)
          // An old sequencer that dies before it forwarded everything must not leave the topic held.
          replica.run(Effect.sleep(TRANSFER_TIMEOUT).pipe(Effect.zipRight(Effect.suspend(() => (state.phase === "receiving" ? state.resume : Effect.void)))))
          return { replica: replica.id }
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
    return Effect.gen(function*() {
      replica.stopping = true
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
  })
