/**
 * Broker replicas survive each other: over NATS, the replica that hosts a room's participants and
 * sequences its topic stops; the other adopts the sockets and takes the topic over, and the room
 * goes on in one order with no second welcome or presence.
 */
import { describe, expect, it } from "@effect/vitest"
import { Broker } from "@switchboard/broker"
import { Actors, Kv, Subjects } from "@switchboard/bus"
import { NatsServer } from "@switchboard/testing"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import { join, type Participant } from "./support/Participants.ts"
import { natsEdge, replica } from "./support/Stack.ts"

const env = { BROKER_REPLICA_HEARTBEAT: "200 millis" }

describe("broker replicas", () => {
  it.scopedLive("a stopped replica's room carries on at the other", () =>
    Effect.gen(function*() {
      const { servers, ns, ctx, ws } = yield* natsEdge(env)
      const start = replica(Broker.layer, servers, ns, env)

      const first = yield* start
      const alice = yield* join(ws, "room", { id: "alice" })
      const bob = yield* join(ws, "room", { id: "bob" })
      const hello = alice.send({ kind: "chat", payload: { text: "before" } })
      expect((yield* bob.next("chat")).id).toBe(hello.id)
      expect((yield* alice.next("chat")).id).toBe(hello.id)

      /** The replicas that own the broker's connections. */
      const kv = ctx.unsafeMap.get(Kv.Kv.key) as Kv.KvShape
      const owners = Kv.typed(yield* kv.bucket(Subjects.Bucket.connections), Actors.ConnectionRecord).values().pipe(
        Effect.map((records) => new Set(records.filter((r) => r.value.service === "broker").map((r) => r.value.replica))),
        Effect.orDie
      )
      const before = yield* owners
      expect(before.size).toBe(1)

      yield* start
      yield* first.stop
      // Frames sent before the survivor has adopted the sockets are lost, so wait for it: until
      // then the sockets are still the stopped replica's (one owner already, but the wrong one).
      const adopters = yield* owners.pipe(
        Effect.filterOrFail((ids) => ids.size === 1 && ![...ids].some((id) => before.has(id)), () => new Error("not adopted yet")),
        Effect.retry(Schedule.spaced("50 millis")),
        Effect.timeout("10 seconds")
      )
      expect(adopters.size).toBe(1)
      const after = [0, 1, 2].map((i) => alice.send({ kind: "chat", payload: { text: `after ${i}` } }))
      // The very next envelopes are the chats: no second welcome, no presence flapping.
      for (const p of [alice, bob]) {
        const got = yield* Effect.forEach(after, () => p.nextAny)
        expect(got.map((e) => e.id)).toEqual(after.map((e) => e.id))
      }
      const carol = yield* join(ws, "room", { id: "carol" })
      expect(carol.welcome.payload["participants"]).toEqual(
        expect.arrayContaining([{ id: "alice", privilege: "restricted" }, { id: "bob", privilege: "restricted" }])
      )
      expect((yield* alice.nextAny).payload).toEqual({ event: "join", participant: { id: "carol", privilege: "restricted" } })
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)
})

describe("broker replicas whose heartbeat lapsed", () => {
  it.scopedLive("a sequencer whose key lapsed in KV but still runs keeps its topic: a join at the other replica does not take it over", () =>
    Effect.gen(function*() {
      const { servers, ns, ctx, ws } = yield* natsEdge(env)
      const kv = ctx.unsafeMap.get(Kv.Kv.key) as Kv.KvShape
      const replicas = yield* kv.bucket(Subjects.Bucket.replicas)
      const claims = yield* kv.bucket(Subjects.Bucket.topics)
      const holder = claims.get(Subjects.Key.topic("room")).pipe(
        Effect.map((c) => (c._tag === "Some" ? new TextDecoder().decode(c.value.value) : undefined)),
        Effect.orDie
      )
      const records = Kv.typed(yield* kv.bucket(Subjects.Bucket.connections), Actors.ConnectionRecord)
      const ownerOf = (id: string) =>
        records.values().pipe(Effect.map((rs) => rs.find((r) => r.value.open.claims?.sub === id)?.value.replica), Effect.orDie)

      // The first renews its key slowly and sequences the room.
      yield* replica(Broker.layer, servers, ns, { BROKER_REPLICA_HEARTBEAT: "2900 millis" })
      const alice = yield* join(ws, "room", { id: "alice" })
      const first = yield* holder
      if (first === undefined) return yield* Effect.dieMessage("the room has no sequencer")
      yield* replica(Broker.layer, servers, ns, env)

      // As when its heartbeat writes failed through a NATS election: its key is gone, it is not.
      yield* replicas.delete(Subjects.Key.replica("broker", first)).pipe(Effect.orDie)
      // Participants join until one's actor is on the second replica, whose join sets the room up there.
      const joined: Array<Participant> = []
      for (let i = 0; i < 20; i++) {
        const p = yield* join(ws, "room", { id: `p${i}` })
        joined.push(p)
        if ((yield* ownerOf(p.id)) !== first) break
      }
      expect(yield* ownerOf(joined[joined.length - 1]!.id)).not.toBe(first)
      expect(yield* holder).toBe(first)
      // One sequencer: everyone gets alice's envelope once.
      const hello = alice.send({ kind: "chat", payload: { text: "once" } })
      for (const p of [alice, ...joined]) expect((yield* p.next("chat")).id).toBe(hello.id)
      const again = alice.send({ kind: "chat", payload: { text: "twice?" } })
      for (const p of [alice, ...joined]) expect((yield* p.next("chat")).id).toBe(again.id)
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)
})
