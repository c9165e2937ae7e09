/** A topic's sequencer through its interface: welcomes and presence, fan-out, the idle timer, and its phases. */
import { describe, expect, it } from "@effect/vitest"
import { Mcpx } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Queue from "effect/Queue"
import * as TestClock from "effect/TestClock"
import { alice, bob, carol, entry, joined, left, member, onSubject, sequencer, untilIdleTimer } from "./Sequencing.ts"

describe("a topic's sequencer", () => {
  it.scoped("welcomes a joining member with everyone in the topic, and tells the others, not it, that it joined", () =>
    Effect.gen(function*() {
      const { take, topic } = yield* sequencer()
      topic.onEvent(joined(alice))
      topic.onEvent(joined(bob))
      const sent = take()
      expect(sent.map((s) => [s.to, s.envelope.kind, s.envelope.payload["event"]])).toEqual([
        ["e1/c1", "system", "welcome"],
        ["e1/c2", "system", "welcome"],
        ["e1/c1", "presence", "join"]
      ])
      expect(sent[1]?.envelope).toMatchObject({
        to: ["bob"],
        payload: { participant: { id: "bob" }, participants: [{ id: "alice" }, { id: "bob" }], protocol: Mcpx.PROTOCOL }
      })
      expect(sent[2]?.envelope.payload).toMatchObject({ participant: { id: "bob", privilege: "full" } })
    }))

  it.scoped("sends each stored envelope to every member, the sender included, with one send per edge, in history order", () =>
    Effect.gen(function*() {
      const { take, topic } = yield* sequencer()
      for (const m of [alice, bob, carol]) topic.onEvent(joined(m))
      take()
      topic.onEntry(entry(4))
      topic.onEntry(entry(9))
      expect(take().map((s) => `${s.to} ${s.envelope.payload["text"]}`)).toEqual(["e1/c1,c2 e4", "e2/c3 e4", "e1/c1,c2 e9", "e2/c3 e9"])
      expect(topic.delivered).toBe(9)
      // A member gone is no longer sent to.
      topic.onEvent(left(bob))
      take()
      topic.onEntry(entry(10))
      expect(take().map((s) => s.to)).toEqual(["e1/c1", "e2/c3"])
    }))

  it.scoped("closes the socket of a member beyond the topic's limit; the same participant on a newer socket replaces its old one, with no presence", () =>
    Effect.gen(function*() {
      const { closed, take, topic } = yield* sequencer({ maxParticipants: 2 })
      topic.onEvent(joined(alice))
      topic.onEvent(joined(bob))
      take()
      topic.onEvent(joined(carol))
      expect(closed).toEqual(["e2/c3 1008 topic is full"])
      expect(take()).toEqual([])
      const aliceAgain = member("alice", "e2", "c4")
      topic.onEvent(joined(aliceAgain))
      expect(take().map((s) => [s.to, s.envelope.payload["event"]])).toEqual([["e2/c4", "welcome"]])
      // The old socket's leave comes later: it is not alice leaving.
      topic.onEvent(left(alice))
      expect(take()).toEqual([])
      topic.onEvent(left(aliceAgain))
      expect(take().map((s) => [s.to, s.envelope.payload["event"]])).toEqual([["e1/c2", "leave"]])
      expect([...topic.members.keys()]).toEqual(["bob"])
    }))

  it.scoped("a join of the same socket again changes the member without a welcome or a presence", () =>
    Effect.gen(function*() {
      const { take, topic } = yield* sequencer()
      topic.onEvent(joined(alice))
      topic.onEvent(joined(bob))
      take()
      topic.onEvent(joined({ ...bob, privilege: "restricted", assigned: true }))
      expect(take()).toEqual([])
      expect(topic.members.get("bob")?.privilege).toBe("restricted")
    }))

  it.scoped("asks to give the topic up once it has been empty for the idle time, not while someone joined meanwhile", () =>
    Effect.gen(function*() {
      const { released, topic } = yield* sequencer()
      topic.onEvent(joined(alice))
      topic.onEvent(left(alice))
      yield* untilIdleTimer
      topic.onEvent(joined(bob))
      yield* TestClock.adjust("2 minutes")
      topic.onEvent(left(bob))
      yield* untilIdleTimer
      yield* TestClock.adjust("1 minute")
      // The first timer, had it not been stopped, would have asked at two minutes.
      expect(yield* Queue.take(released)).toBe(3 * 60_000)
    }))

  it.scoped("handing on: passes what comes on the subject to the new owner, and sends out no entry", () =>
    Effect.gen(function*() {
      const { published, take, topic } = yield* sequencer({ phase: "handing-on", delivered: 3 })
      topic.onMessage(onSubject(joined(alice)))
      topic.onEntry(entry(4))
      expect(take()).toEqual([])
      expect(published).toEqual([joined(alice)])
      expect(topic.delivered).toBe(3)
    }))

  it.scoped("releasing: holds what comes, asks once to win the claim back, and on resuming handles it in the order it came", () =>
    Effect.gen(function*() {
      const { reclaims, take, topic } = yield* sequencer({ phase: "releasing" })
      topic.onEntry(entry(1))
      topic.onMessage(onSubject(joined(alice)))
      topic.onEntry(entry(2))
      expect(yield* Queue.takeAll(reclaims).pipe(Effect.map((c) => c.length))).toBe(1)
      expect(take()).toEqual([])
      yield* topic.resume
      expect(topic.phase).toBe("owner")
      // Joins first (its subject's share), then the entries: alice hears both.
      expect(take().map((s) => s.envelope.payload["event"] ?? s.envelope.payload["text"])).toEqual(["welcome", "e1", "e2"])
      expect(topic.delivered).toBe(2)
    }))

  it.scoped("records the last sequence sent out, only when it moved since the last record", () =>
    Effect.gen(function*() {
      const { recorded, topic } = yield* sequencer({ delivered: 3 })
      yield* topic.recordDelivered
      topic.onEvent(joined(alice))
      topic.onEntry(entry(7))
      yield* topic.recordDelivered
      yield* topic.recordDelivered
      expect(recorded).toEqual([7])
      expect(topic.recorded).toBe(7)
    }))
})
