/**
 * A topic changing hands between broker replicas, on either side (`Transfer`), driven through a
 * sequencer with no bus: the old one's share of joins and leaves is forwarded, the new one's held.
 */
import { describe, expect, it } from "@effect/vitest"
import { Mcpx } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import { Transfer } from "../src/TopicTransfer.ts"
import { alice, bob, carol, joined, left, onSubject, sequencer } from "./Sequencing.ts"

describe("a topic changing hands", () => {
  it.scoped("the old sequencer keeps what came before the new one's marker to forward, and what came after apart", () =>
    Effect.gen(function*() {
      const transfer = new Transfer("t1")
      const { take, topic } = yield* sequencer({ phase: "transferring", transfer })
      topic.onMessage(onSubject(joined(alice)))
      topic.onMessage(onSubject(new Mcpx.TopicMarker({ token: "someone else's" })))
      expect(transfer.marked).toBe(false)
      topic.onMessage(onSubject(new Mcpx.TopicMarker({ token: "t1" })))
      topic.onMessage(onSubject(joined(bob)))
      yield* transfer.markerReached
      expect(topic.held.map((m) => topic.event(m))).toEqual([joined(alice)])
      expect(transfer.after.map((m) => topic.event(m))).toEqual([joined(bob)])
      expect(take()).toEqual([])
    }))

  it.scoped("the new sequencer handles the forwarded share first, then what it heard after its marker, and the old one's end of it resumes it", () =>
    Effect.gen(function*() {
      const transfer = new Transfer("t1")
      const { settled, take, topic } = yield* sequencer({ phase: "receiving", transfer })
      // Before the marker: the old sequencer heard these too, and forwards them.
      topic.onMessage(onSubject(joined(carol)))
      topic.onMessage(onSubject(left(carol)))
      topic.onMessage(onSubject(new Mcpx.TopicMarker({ token: "t1" })))
      topic.onMessage(onSubject(joined(bob)))
      topic.onMessage(onSubject(new Mcpx.TopicForwarded({ event: joined(carol) })))
      topic.onMessage(onSubject(new Mcpx.TopicForwarded({ event: left(carol) })))
      expect(take().map((s) => `${s.to} ${s.envelope.payload["event"]}`)).toEqual(["e2/c3 welcome"])
      // Another hand-off's end is not this one's.
      topic.onMessage(onSubject(new Mcpx.TopicForwardEnd({ token: "t0" })))
      yield* settled
      expect(topic.phase).toBe("receiving")
      topic.onMessage(onSubject(new Mcpx.TopicForwardEnd({ token: "t1" })))
      yield* settled
      expect(topic.phase).toBe("owner")
      expect(take().map((s) => `${s.to} ${s.envelope.payload["event"]}`)).toEqual(["e1/c2 welcome"])
      expect([...topic.members.keys()]).toEqual(["bob"])
    }))
})
