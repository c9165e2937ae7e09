/**
 * Claiming a topic on the embedded bus: a topic nobody holds, one this replica holds, one a live
 * replica holds, and one whose holder is gone, which is taken over.
 */
import { describe, expect, it } from "@effect/vitest"
import { Bus, Kv, MemoryBus, Peer, Subjects } from "@switchboard/bus"
import { Host } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { holderOf } from "../src/Replica.ts"
import { claim } from "../src/StaleBrokers.ts"

/** The buckets a claim reads, and `claimAs(replica, topic)`. */
const claims = Effect.gen(function*() {
  const bus = yield* Bus.Bus
  const kv = yield* Kv.Kv
  const topics = yield* kv.bucket(Subjects.Bucket.topics)
  const replicas = yield* kv.bucket(Subjects.Bucket.replicas)
  const claimAs = (id: string, topic: string) => claim({ bus, claims: topics, replicas, id }, topic)
  const holder = (topic: string) => Effect.map(topics.get(Subjects.Key.topic(topic)), Option.map((e) => holderOf(e.value)))
  return { claimAs, holder, replicas }
})

describe("claiming a topic", () => {
  it.scoped("takes a topic nobody holds, and finds its own claim its own", () =>
    Effect.gen(function*() {
      const { claimAs, holder } = yield* claims
      expect(yield* claimAs("r1", "room")).toBe("created")
      expect(yield* holder("room")).toEqual(Option.some("r1"))
      expect(yield* claimAs("r1", "room")).toBe("ours")
    }).pipe(Effect.provide(MemoryBus.layer)))

  it.scoped("leaves a topic to a holder whose liveness key is there, and takes it from one that is gone", () =>
    Effect.gen(function*() {
      const { claimAs, holder, replicas } = yield* claims
      yield* claimAs("r1", "room")
      yield* replicas.put(Subjects.Key.replica("broker", "r1"), "alive")
      expect(yield* claimAs("r2", "room")).toBe("elsewhere")
      expect(yield* holder("room")).toEqual(Option.some("r1"))
      yield* replicas.delete(Subjects.Key.replica("broker", "r1"))
      expect(yield* claimAs("r2", "room")).toBe("ours")
      expect(yield* holder("room")).toEqual(Option.some("r2"))
    }).pipe(Effect.provide(MemoryBus.layer)))

  it.scoped("asks a holder whose key lapsed before taking its topic: one that answers keeps it", () =>
    Effect.gen(function*() {
      const { claimAs, holder } = yield* claims
      yield* claimAs("r1", "room")
      // As r1's actor host answers on its inbox while it runs.
      yield* Peer.protocol(Host.ReplicaInbox).serve(Subjects.replicaInbox("broker", "r1"), (request, reply) =>
        request._tag === "Ping" ? reply(request).succeed("r1") : Effect.void)
      expect(yield* claimAs("r2", "room")).toBe("elsewhere")
      expect(yield* holder("room")).toEqual(Option.some("r1"))
    }).pipe(Effect.provide(MemoryBus.layer)))
})
