// SWITCHBOARD_STATE_REPLICAS on a three-node NATS cluster: buckets and journals get that many
// replicas, ones made earlier with fewer are scaled up, and state outlives the node that led it.
// Journal appends are acknowledged: those made during an election are stored once it is over.
import { describe, expect, it } from "@effect/vitest"
import { NatsCluster } from "@switchboard/testing"
import { jetstreamManager } from "@nats-io/jetstream"
import { connect } from "@nats-io/transport-node"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Journal from "../src/Journal.ts"
import * as Kv from "../src/Kv.ts"
import * as NatsBus from "../src/NatsBus.ts"

const decoder = new TextDecoder()
const JOURNAL: Journal.JournalSpec = { name: "history", maxMessagesPerKey: 100, maxBytes: 1024 * 1024, maxAge: "1 hour", retryFor: "30 seconds" }

/** Replicas and leader of a stream, as the server reports them. */
const streamInfo = (servers: ReadonlyArray<string>, stream: string) =>
  Effect.tryPromise({
    try: async () => {
      const nc = await connect({ servers: [...servers] })
      try {
        const info = await (await jetstreamManager(nc)).streams.info(stream)
        return { replicas: info.config.num_replicas, leader: info.cluster?.leader }
      } finally {
        await nc.close()
      }
    },
    catch: (e) => new Error(`stream info ${stream}: ${e instanceof Error ? e.message : String(e)}`)
  }).pipe(Effect.retry({ schedule: Schedule.spaced("250 millis"), times: 20 }))

/** A step that must end within `seconds`: a hang fails with the step's name, not the test's timeout. */
const step = (label: string, seconds = 20) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.timeoutFail(effect, { duration: `${seconds} seconds`, onTimeout: () => new Error(`${label}: not done within ${seconds} s`) })

describe("state replicas on a NATS cluster", () => {
  it.scopedLive("scales R1 buckets and journals to R3, and keeps their state when the leader's node dies", () =>
    Effect.gen(function*() {
      const cluster = yield* NatsCluster
      const namespace = `rep${process.pid}`
      const build = (replicas: number) => Layer.build(NatsBus.layer({ servers: cluster.servers, namespace, replicas }))

      // As a deployment before SWITCHBOARD_STATE_REPLICAS: one replica each.
      const before = yield* build(1).pipe(step("connect"))
      const oldBucket = yield* Context.get(before, Kv.Kv).bucket({ name: "tabs" })
      yield* oldBucket.put("alice.1", "before")
      yield* Context.get(before, Journal.Journal).open(JOURNAL)
      expect((yield* streamInfo(cluster.servers, `KV_${namespace}_tabs`)).replicas).toBe(1)

      // The same names opened with 3: scaled up in place, nothing lost.
      const after = yield* build(3).pipe(step("connect again"))
      // A fresh cluster places R3 streams only once every node has joined (0.8 to 4 s, TESTCONTAINERS.md).
      const placing = { while: (e: { readonly message: string }) => /no suitable peers/.test(e.message), schedule: Schedule.spaced("250 millis"), times: 40 }
      const bucket = yield* Context.get(after, Kv.Kv).bucket({ name: "tabs" }).pipe(Effect.retry(placing), step("scale the bucket up"))
      const journal = yield* Context.get(after, Journal.Journal).open(JOURNAL).pipe(Effect.retry(placing), step("scale the journal up"))
      const kvStream = yield* streamInfo(cluster.servers, `KV_${namespace}_tabs`)
      expect(kvStream.replicas).toBe(3)
      expect((yield* streamInfo(cluster.servers, `${namespace}_history`)).replicas).toBe(3)
      expect(Option.map(yield* bucket.get("alice.1"), (e) => decoder.decode(e.value))).toEqual(Option.some("before"))
      // Bucket replicas take a moment to catch up after the scale-up.
      const put = bucket.put("alice.2", "r3").pipe(Effect.retry({ schedule: Schedule.spaced("250 millis"), times: 40 }))
      yield* put.pipe(step("put after the scale-up"))
      // Appended at once, while the scaled-up stream may still be electing its leader: each is
      // acknowledged, or sent again until it is.
      for (let i = 0; i < 3; i++) journal.append("room", `entry ${i}`)
      const stored = (n: number) =>
        Effect.suspend(() => journal.read("room", { limit: 20 })).pipe(
          Effect.map(({ entries }) => entries.map((e) => decoder.decode(e.data))),
          Effect.filterOrFail((entries) => entries.length === n, (entries) => new Error(`the journal holds ${entries.length} of ${n} entries`)),
          Effect.retry({ schedule: Schedule.spaced("250 millis"), times: 80 })
        )
      expect(yield* stored(3).pipe(step("3 entries stored", 30))).toEqual(["entry 0", "entry 1", "entry 2"])

      // Kill the node that leads the bucket (n0, n1 or n2): reads and writes go on through the others.
      const leader = yield* streamInfo(cluster.servers, `KV_${namespace}_tabs`).pipe(
        Effect.map((info) => Number(info.leader?.slice(1))),
        Effect.filterOrFail((n) => n === 0 || n === 1 || n === 2, () => new Error("the bucket has no leader")),
        Effect.retry({ schedule: Schedule.spaced("100 millis"), times: 50 }),
        step("find the leader")
      )
      yield* cluster.kill(leader).pipe(step("kill the leader"))
      // Appends while the cluster elects new leaders: none lost, none stored twice.
      for (let i = 3; i < 6; i++) journal.append("room", `entry ${i}`)
      // A read that reaches no live replica takes JetStream's 5 s timeout to fail: under CI's load the
      // cluster has taken over 20 s to serve again, so the steps after the loss are bounded by time.
      // KV reads are direct gets, which any replica answers: one still applying what the new leader
      // committed answers without it (a landing CI read "alice.3" as absent right after its put).
      // A value is lost only if no replica ever serves it again, so a read waits for it.
      const retry = Schedule.spaced("250 millis")
      const read = (key: string, value: string) =>
        bucket.get(key).pipe(
          Effect.map(Option.map((e) => decoder.decode(e.value))),
          Effect.filterOrFail(
            (found) => Option.contains(found, value),
            (found) => new Error(`${key} reads ${Option.getOrElse(found, () => "absent")}, not ${value}`)
          ),
          Effect.retry(retry)
        )
      const killed = Date.now()
      yield* read("alice.1", "before").pipe(step("read after the loss", 60))
      console.log(`read again ${Date.now() - killed} ms after the leader's node was killed`)
      yield* read("alice.2", "r3").pipe(step("read again", 60))
      yield* bucket.put("alice.3", "after the loss").pipe(Effect.retry(retry), step("put after the loss", 60))
      yield* read("alice.3", "after the loss").pipe(step("read what was put", 60))
      expect([...(yield* stored(6).pipe(step("6 entries stored", 30)))].sort()).toEqual(["entry 0", "entry 1", "entry 2", "entry 3", "entry 4", "entry 5"])
      yield* cluster.restart(leader).pipe(step("restart the node"))
    }).pipe(Effect.scoped, Effect.provide(NatsCluster.layer)), 240_000)
})
