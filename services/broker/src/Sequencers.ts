/**
 * The sequencers of one broker replica: setting one up for a topic before a join is published to
 * it, by claiming the topic in KV (or finding it claimed by a live replica, which sequences it
 * then). Each sequencer (`TopicSequencer.ts`) gets the replica's link, settings and the roles it
 * hands its other phases to.
 */
import { type Bus, type Kv, Subjects } from "@switchboard/bus"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as ExecutionStrategy from "effect/ExecutionStrategy"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import type { Replica } from "./Replica.ts"
import * as StaleBrokers from "./StaleBrokers.ts"
import type * as TopicRelease from "./TopicRelease.ts"
import { type Sequencing, type Start, TopicSequencer } from "./TopicSequencer.ts"

const decoder = new TextDecoder()

export const make = (replica: Replica, release: ReturnType<typeof TopicRelease.make>) => {
  const { bus, claims, config, history, sequenced, settingUp } = replica
  const sequencing: Sequencing = {
    link: replica.link,
    tracer: replica.tracer,
    maxParticipants: config.maxParticipants,
    topicIdle: config.topicIdle,
    run: replica.run,
    toTopic: replica.toTopic,
    decode: replica.topicEvent,
    record: (topic, seq) => claims.put(Subjects.Key.topicDelivered(topic), String(seq)),
    release: release.release,
    reclaim: release.reclaim
  }

  /** A sequencer for `topic`, listening in a scope of its own under the replica's sequencers' scope. */
  const create = (topic: string, start: Start) =>
    Effect.map(Scope.fork(replica.scope, ExecutionStrategy.sequential), (subscription) => new TopicSequencer(sequencing, topic, subscription, start))

  /**
   * Makes sure someone sequences `topic` before a join is published to it. The sequencer
   * subscribes before it claims the topic, so once a claim is visible in KV its owner is already
   * listening; what arrives before the claim is decided waits, and is dropped if another replica won.
   */
  const ensure = (topic: string): Effect.Effect<void, Bus.BusError | Kv.KvConflict> => {
    const current = sequenced.get(topic)
    // Being let go of: set up again (or found won back) once that is over.
    if (current?.released !== undefined) return Effect.zipRight(Deferred.await(current.released), Effect.suspend(() => ensure(topic)))
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
      const state = yield* create(topic, { delivered: 0, phase: "owner" })
      let owner = false
      const early: Array<Bus.BusMessage> = []
      yield* bus.subscribe(Subjects.topic(topic), (m) => (owner ? state.onMessage(m) : void early.push(m))).pipe(Scope.extend(state.subscription))

      const claimed = yield* StaleBrokers.claim(replica, topic)
      if (claimed === "elsewhere") return yield* Scope.close(state.subscription, Exit.void)
      // Taken over: with the members its predecessor had welcomed.
      if (claimed === "ours") {
        for (const { value } of yield* replica.members.values(Subjects.Key.members(topic))) state.members.set(value.participant, value)
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
        Option.isNone(recorded) ? sequencing.record(topic, state.recorded) : Effect.void,
        history.follow(Subjects.historyKey(topic), { from: state.delivered + 1 }, state.onEntry).pipe(Scope.extend(state.subscription))
      ], { concurrency: 2, discard: true })
      owner = true
      sequenced.set(topic, state)
      for (const m of early) state.onMessage(m)
      // A participant that never gets as far as its join leaves the topic empty from the start.
      state.idleWhenEmpty()
    })

  return { create, ensure }
}

export type Sequencers = ReturnType<typeof make>
