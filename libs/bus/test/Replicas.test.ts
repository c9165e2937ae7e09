// SWITCHBOARD_STATE_REPLICAS on a three-node NATS cluster: buckets and journals get that many
// replicas, ones made earlier with fewer are scaled up, and state outlives the node that led it.
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
const JOURNAL: Journal.JournalSpec = { name: "history", maxMessages: 100, maxBytes: 1024 * 1024, maxAge: "1 hour" }

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

describe("state replicas on a NATS cluster", () => {
  it.scopedLive("scales R1 buckets and journals to R3, and keeps their state when the leader's node dies", () =>
    Effect.gen(function*() {
      const cluster = yield* NatsCluster
      const namespace = `rep${process.pid}`
      const build = (replicas: number) => Layer.build(NatsBus.layer({ servers: cluster.servers, namespace, replicas }))

      // As a deployment before SWITCHBOARD_STATE_REPLICAS: one replica each.
      const before = yield* build(1)
      const oldBucket = yield* Context.get(before, Kv.Kv).bucket({ name: "tabs" })
      yield* oldBucket.put("alice.1", "before")
      yield* Context.get(before, Journal.Journal).open(JOURNAL)
      expect((yield* streamInfo(cluster.servers, `KV_${namespace}_tabs`)).replicas).toBe(1)

      // The same names opened with 3: scaled up in place, nothing lost.
      const after = yield* build(3)
      // A fresh cluster places R3 streams only once every node has joined (0.8 to 4 s, TESTCONTAINERS.md).
      const placing = { while: (e: { readonly message: string }) => /no suitable peers/.test(e.message), schedule: Schedule.spaced("250 millis"), times: 40 }
      const bucket = yield* Context.get(after, Kv.Kv).bucket({ name: "tabs" }).pipe(Effect.retry(placing))
      const journal = yield* Context.get(after, Journal.Journal).open(JOURNAL).pipe(Effect.retry(placing))
      const kvStream = yield* streamInfo(cluster.servers, `KV_${namespace}_tabs`)
      expect(kvStream.replicas).toBe(3)
      expect((yield* streamInfo(cluster.servers, `${namespace}_history`)).replicas).toBe(3)
      expect(Option.map(yield* bucket.get("alice.1"), (e) => decoder.decode(e.value))).toEqual(Option.some("before"))
      // Bucket replicas take a moment to catch up after the scale-up.
      const put = bucket.put("alice.2", "r3").pipe(Effect.retry({ schedule: Schedule.spaced("250 millis"), times: 40 }))
      yield* put
      // Appends are core publishes, unacknowledged (issue 18): one made while the scaled-up stream
      // elects its leader is lost, so wait for the leader first.
      yield* streamInfo(cluster.servers, `${namespace}_history`).pipe(
        Effect.filterOrFail((info) => info.replicas === 3 && info.leader !== undefined, () => new Error("the journal has no leader")),
        Effect.retry({ schedule: Schedule.spaced("100 millis"), times: 50 })
      )
      for (let i = 0; i < 3; i++) journal.append(`entry ${i}`)
      yield* Effect.suspend(() => journal.read({ limit: 10 })).pipe(
        Effect.filterOrFail((entries) => entries.length === 3, (entries) => new Error(`the journal holds ${entries.length} of 3 entries`)),
        Effect.retry({ schedule: Schedule.spaced("100 millis"), times: 50 })
      )

      // Kill the node that leads the bucket (n0, n1 or n2): reads and writes go on through the others.
      const leader = yield* streamInfo(cluster.servers, `KV_${namespace}_tabs`).pipe(
        Effect.map((info) => Number(info.leader?.slice(1))),
        Effect.filterOrFail((n) => n === 0 || n === 1 || n === 2, () => new Error("the bucket has no leader")),
        Effect.retry({ schedule: Schedule.spaced("100 millis"), times: 50 })
      )
      yield* cluster.kill(leader)
      const retry = { schedule: Schedule.spaced("250 millis"), times: 60 }
      const read = (key: string) => bucket.get(key).pipe(Effect.map(Option.map((e) => decoder.decode(e.value))), Effect.retry(retry))
      expect(yield* read("alice.1")).toEqual(Option.some("before"))
      expect(yield* read("alice.2")).toEqual(Option.some("r3"))
      yield* bucket.put("alice.3", "after the loss").pipe(Effect.retry(retry))
      expect(yield* read("alice.3")).toEqual(Option.some("after the loss"))
      const entries = yield* journal.read({ limit: 10 }).pipe(Effect.retry(retry))
      expect(entries.map((e) => decoder.decode(e.data))).toEqual(["entry 0", "entry 1", "entry 2"])
      yield* cluster.restart(leader)
    }).pipe(Effect.scoped, Effect.provide(NatsCluster.layer)), 120_000)
})
