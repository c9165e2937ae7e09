// A journal follower whose consumer dies with its NATS node (a three-node cluster, R3 journal):
// nats.js only asks after an ordered consumer it cannot reach, while JetStream answers with
// timeouts, and a topic's sequencer sat for up to 100 s in the chaos suite. The follower makes a
// new consumer after two missed heartbeats, from the last sequence it delivered.
import { expect, layer } from "@effect/vitest"
import { jetstreamManager } from "@nats-io/jetstream"
import { connect } from "@nats-io/transport-node"
import { NatsCluster } from "@switchboard/testing"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import { Journal } from "../src/Journal.ts"
import * as NatsBus from "../src/NatsBus.ts"

layer(NatsCluster.layer, { excludeTestServices: true, timeout: "120 seconds" })("a journal follower", (it) => {
  it.scoped("carries on, in order, after the node that held its consumer is killed", () =>
    Effect.gen(function*() {
      const cluster = yield* NatsCluster
      const namespace = `follow${process.pid}`
      const ctx = yield* Layer.build(NatsBus.layer({ servers: cluster.servers, namespace, replicas: 3 }))
      // A fresh cluster places R3 streams once every node has joined (0.8 to 4 s, TESTCONTAINERS.md).
      const journal = yield* Context.get(ctx, Journal).open({ name: "history", maxMessagesPerKey: 100, maxAge: "1 hour", maxBytes: 1_000_000, retryFor: "60 seconds" }).pipe(
        Effect.retry({ while: (e) => /no suitable peers/.test(e.message), schedule: Schedule.spaced("250 millis"), times: 40 })
      )
      const received = yield* Queue.unbounded<string>()
      yield* journal.follow("room", {}, (e) => void Queue.unsafeOffer(received, new TextDecoder().decode(e.data)))
      const within = (seconds: number) =>
        Queue.take(received).pipe(Effect.timeoutFail({ duration: `${seconds} seconds`, onTimeout: () => new Error(`nothing followed within ${seconds} s`) }))
      // The first append waits for the new stream's leader, which a busy machine elects slowly.
      journal.append("room", "one")
      expect(yield* within(60)).toBe("one")

      // The node that holds the follower's consumer.
      const nc = yield* Effect.acquireRelease(Effect.promise(() => connect({ servers: [...cluster.servers] })), (c) => Effect.promise(() => c.close()))
      const jsm = yield* Effect.promise(() => jetstreamManager(nc))
      const holder = yield* Effect.promise(async () => {
        for await (const c of jsm.consumers.list(`${namespace}_history`)) return c.cluster?.leader
        return undefined
      })
      const node = Number(holder?.slice(1))
      expect([0, 1, 2]).toContain(node)
      yield* cluster.kill(node)

      journal.append("room", "two")
      journal.append("room", "three")
      const startedAt = Date.now()
      expect([yield* within(45), yield* within(5)]).toEqual(["two", "three"])
      console.log(`followed again ${Date.now() - startedAt} ms after its consumer's node was killed`)
      yield* cluster.restart(node)
    }), 150_000)
})
