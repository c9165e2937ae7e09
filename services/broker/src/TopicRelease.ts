/**
 * Letting go of a topic nobody is in. A topic's sequencer costs a subscription, a claim in KV and
 * its state, for as long as the replica runs; topics are as many as names anyone joins. Once a
 * topic has been empty for MCPX_TOPIC_IDLE, its sequencer gives up its claim and, after
 * RELEASE_GRACE, the rest. The history stays in the journal, and the next join sets a sequencer
 * up again. What arrives in the grace wins the claim back, or goes to whoever won it.
 */
import { Subjects } from "@switchboard/bus"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import { forget, holderOf, type Replica } from "./Replica.ts"
import type { TopicSequencer } from "./TopicSequencer.ts"

/**
 * How long a sequencer that gave up its claim still listens before it lets go of the topic: a
 * participant that saw the claim just before it went publishes its join a KV round trip later,
 * and that join has to win the claim back rather than be lost.
 */
const RELEASE_GRACE = "1 second"

export const make = (replica: Pick<Replica, "claims" | "id" | "sequenced">) => {
  const { claims } = replica

  const letGo = (topic: TopicSequencer) =>
    Effect.gen(function*() {
      topic.phase = "handing-on"
      for (const m of topic.held.splice(0)) topic.handOn(m)
      // Not sent out here: the recorded sequence is before them, so the new owner replays them.
      topic.heldEntries.length = 0
      forget(replica, topic)
      yield* Scope.close(topic.subscription, Exit.void)
      topic.releaseEnded()
    })

  /** Something arrived after the claim was given up: win it back, or hand it to whoever has it. */
  const reclaim = (topic: TopicSequencer) => {
    topic.reclaiming = true
    return claims.create(Subjects.Key.topic(topic.name), replica.id).pipe(
      Effect.matchCauseEffect({
        onSuccess: () => topic.resume,
        onFailure: (cause) =>
          Effect.zipRight(
            Effect.logDebug(`topic ${topic.name} was claimed by another replica meanwhile`, cause),
            letGo(topic)
          )
      })
    )
  }

  /** The topic has been empty for MCPX_TOPIC_IDLE: give up its claim, then, after the grace, the rest. */
  const release = (topic: TopicSequencer) =>
    Effect.gen(function*() {
      if (topic.members.size > 0 || topic.phase !== "owner") return
      const key = Subjects.Key.topic(topic.name)
      const current = yield* claims.get(key)
      // Taken over by a replica that thought this one gone: it is not ours to give up.
      if (Option.isNone(current) || holderOf(current.value.value) !== replica.id) return yield* letGo(topic)
      yield* topic.recordDelivered
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
      Effect.catchAll((e) => Effect.zipRight(Effect.logWarning(`could not release topic ${topic.name}; it stays set up`, e), topic.resume))
    )

  return { release, reclaim }
}
