// KV writes during a stream leader election on a three-node cluster: JetStream answers 503 (no
// leader) until the election is over, and a write tried again within NATS_KV_WRITE_RETRY goes
// through, instead of failing the heartbeat or the claim that made it.
import { describe, expect, it } from "@effect/vitest"
import { jetstreamManager } from "@nats-io/jetstream"
import { connect } from "@nats-io/transport-node"
import { NatsCluster } from "@switchboard/testing"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Kv from "../src/Kv.ts"
import * as NatsBus from "../src/NatsBus.ts"

const decoder = new TextDecoder()

/** The node (0, 1 or 2) that leads a stream, as the server reports it. */
const leaderOf = (servers: ReadonlyArray<string>, stream: string) =>
  Effect.tryPromise(async () => {
    const nc = await connect({ servers: [...servers] })
    try {
      return (await (await jetstreamManager(nc)).streams.info(stream)).cluster?.leader
    } finally {
      await nc.close()
    }
  }).pipe(
    Effect.map((leader) => Number(leader?.slice(1))),
    Effect.filterOrFail((n) => n === 0 || n === 1 || n === 2),
    Effect.retry({ schedule: Schedule.spaced("100 millis"), times: 100 }),
    Effect.orDie
  )

describe("KV writes during a leader election", () => {
  it.scopedLive("a put right after the bucket's leader node dies goes through once a new leader is elected", () =>
    Effect.gen(function*() {
      const cluster = yield* NatsCluster
      const namespace = `elect${process.pid}`
      const ctx = yield* Layer.build(NatsBus.layer({ servers: cluster.servers, namespace, replicas: 3, kvWriteRetry: "20 seconds" }))
      // A fresh cluster places R3 streams once every node has joined (0.8 to 4 s, TESTCONTAINERS.md).
      const bucket = yield* Context.get(ctx, Kv.Kv).bucket({ name: "replicas" }).pipe(
        Effect.retry({ while: (e) => /no suitable peers/.test(e.message), schedule: Schedule.spaced("250 millis"), times: 40 })
      )
      yield* bucket.put("r1", "before").pipe(Effect.retry({ schedule: Schedule.spaced("250 millis"), times: 40 }))
      const leader = yield* leaderOf(cluster.servers, `KV_${namespace}_replicas`)
      yield* cluster.kill(leader)
      const startedAt = performance.now()
      // No retry here: the bucket's own, for JetStream unavailable, is what is tested.
      yield* bucket.put("r1", "during the election")
      console.log(`put during a leader election took ${(performance.now() - startedAt).toFixed(0)} ms`)
      const read = yield* bucket.get("r1").pipe(Effect.retry({ schedule: Schedule.spaced("250 millis"), times: 40 }))
      expect(Option.map(read, (e) => decoder.decode(e.value))).toEqual(Option.some("during the election"))
      yield* cluster.restart(leader)
    }).pipe(Effect.scoped, Effect.provide(NatsCluster.layer)), 120_000)
})
