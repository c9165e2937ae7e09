/**
 * Giving up a topic nobody is in, on the embedded bus's KV and the test clock: the claim goes, the
 * topic is let go after the grace, and what arrives meanwhile wins the claim back or goes on to
 * whoever won it.
 */
import { describe, expect, it } from "@effect/vitest"
import { Kv, MemoryBus, Subjects } from "@switchboard/bus"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import * as TestClock from "effect/TestClock"
import { holderOf } from "../src/Replica.ts"
import * as TopicRelease from "../src/TopicRelease.ts"
import type { TopicSequencer } from "../src/TopicSequencer.ts"
import { alice, entry, joined, onSubject, sequencer, untilIdleTimer } from "./Sequencing.ts"

const key = Subjects.Key.topic("room")

/** Topic `room`, sequenced by replica r1 with the real release role, and who holds its claim. */
const releasable = Effect.gen(function*() {
  const claims = yield* (yield* Kv.Kv).bucket(Subjects.Bucket.topics)
  const sequenced = new Map<string, TopicSequencer>()
  const roles = TopicRelease.make({ claims, id: "r1", sequenced })
  const harness = yield* sequencer({ roles })
  sequenced.set("room", harness.topic)
  const holder = Effect.map(claims.get(key), Option.map((e) => holderOf(e.value)))
  return { ...harness, claims, roles, sequenced, holder }
})

/** Until the sequencer is `phase`, which a fiber of its own brings about. */
const until = (topic: TopicSequencer, phase: TopicSequencer["phase"]) => Effect.yieldNow().pipe(Effect.repeat({ until: () => topic.phase === phase }))

describe("giving up an idle topic", () => {
  it.scoped("gives up its own claim, records what it sent out, and after the grace lets the topic go", () =>
    Effect.gen(function*() {
      const { claims, holder, recorded, roles, sequenced, topic } = yield* releasable
      yield* claims.create(key, "r1")
      topic.onEntry(entry(7))
      const release = yield* Effect.fork(roles.release(topic))
      yield* untilIdleTimer
      expect(topic.phase).toBe("releasing")
      expect(yield* holder).toEqual(Option.none())
      expect(recorded).toEqual([7])
      yield* TestClock.adjust("1 second")
      yield* Fiber.join(release)
      expect(topic.phase).toBe("handing-on")
      expect(topic.released).toBeUndefined()
      expect(sequenced.has("room")).toBe(false)
    }).pipe(Effect.provide(MemoryBus.layer)))

  it.scoped("lets a topic go at once when another replica took its claim over, and leaves that claim", () =>
    Effect.gen(function*() {
      const { claims, holder, recorded, roles, sequenced, topic } = yield* releasable
      yield* claims.create(key, "r2")
      yield* roles.release(topic)
      expect(topic.phase).toBe("handing-on")
      expect(yield* holder).toEqual(Option.some("r2"))
      expect(recorded).toEqual([])
      expect(sequenced.has("room")).toBe(false)
    }).pipe(Effect.provide(MemoryBus.layer)))

  it.scoped("keeps a topic someone joined before the timer ran out, and its claim untouched", () =>
    Effect.gen(function*() {
      const { claims, holder, recorded, roles, topic } = yield* releasable
      const revision = yield* claims.create(key, "r1")
      topic.onEvent(joined(alice))
      topic.onEntry(entry(5))
      yield* roles.release(topic)
      expect(topic.phase).toBe("owner")
      expect(yield* holder).toEqual(Option.some("r1"))
      expect(Option.map(yield* claims.get(key), (e) => e.revision)).toEqual(Option.some(revision))
      expect(recorded).toEqual([])
    }).pipe(Effect.provide(MemoryBus.layer)))

  it.scoped("an envelope stored in the grace wins the claim back: the topic is sequenced again and sends it out", () =>
    Effect.gen(function*() {
      const { claims, holder, roles, sequenced, topic } = yield* releasable
      yield* claims.create(key, "r1")
      const release = yield* Effect.fork(roles.release(topic))
      yield* untilIdleTimer
      topic.onEntry(entry(8))
      yield* until(topic, "owner")
      expect(topic.delivered).toBe(8)
      expect(yield* holder).toEqual(Option.some("r1"))
      yield* TestClock.adjust("1 second")
      yield* Fiber.join(release)
      expect(topic.phase).toBe("owner")
      expect(sequenced.get("room")).toBe(topic)
    }).pipe(Effect.provide(MemoryBus.layer)))

  it.scoped("a join in the grace, when another replica claimed the topic meanwhile, goes on to that one", () =>
    Effect.gen(function*() {
      const { claims, holder, published, roles, topic } = yield* releasable
      yield* claims.create(key, "r1")
      yield* Effect.fork(roles.release(topic))
      yield* untilIdleTimer
      yield* claims.create(key, "r2")
      topic.onMessage(onSubject(joined(alice)))
      yield* until(topic, "handing-on")
      expect(published).toEqual([joined(alice)])
      expect(topic.members.size).toBe(0)
      expect(yield* holder).toEqual(Option.some("r2"))
    }).pipe(Effect.provide(MemoryBus.layer)))
})
