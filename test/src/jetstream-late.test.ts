/**
 * A service started before its NATS has JetStream (a server still starting, an election) waits for
 * it instead of exiting: the broker is started against a server without JetStream, which enables
 * it only after the broker has asked for it; the broker then serves a room.
 */
import { describe, expect, it } from "@effect/vitest"
import { Broker } from "@switchboard/broker"
import { Edge } from "@switchboard/edge"
import { NatsLateJetStream } from "@switchboard/testing"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import { join } from "./support/Participants.ts"
import { busLayer, namespace, replica, stack } from "./support/Stack.ts"

describe("JetStream enabled late", () => {
  it.scopedLive("a broker started before JetStream is enabled waits for it, then serves", () =>
    Effect.gen(function*() {
      const nats = yield* NatsLateJetStream
      const ns = namespace()
      const starting = yield* Effect.fork(replica(Broker.layer, nats.servers, ns))
      // The broker has asked JetStream for something (opening its buckets) and found it missing.
      yield* nats.requests.pipe(
        Effect.filterOrFail((n) => n > 0),
        Effect.retry(Schedule.spaced("20 millis").pipe(Schedule.upTo("20 seconds"))),
        Effect.orDieWith(() => new Error("the broker asked NATS nothing within 20 s"))
      )
      expect(starting.unsafePoll()).toBeNull()
      yield* nats.enableJetStream
      yield* Fiber.join(starting).pipe(
        Effect.timeoutFail({ duration: "60 seconds", onTimeout: () => new Error("the broker did not start within 60 s of JetStream") })
      )

      const ctx = yield* Layer.build(stack(busLayer(nats.servers, ns)))
      const ws = (ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape).url.replace("http", "ws")
      const alice = yield* join(ws, "late", { id: "alice", privilege: "full" })
      const hello = alice.send({ kind: "chat", payload: { text: "JetStream is here" } })
      expect((yield* alice.next("chat")).id).toBe(hello.id)
    }).pipe(Effect.scoped, Effect.provide(NatsLateJetStream.layer)), 120_000)
})
