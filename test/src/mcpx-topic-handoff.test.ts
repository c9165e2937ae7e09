/**
 * The broker's topic hand-off as a typed ask (`Mcpx.TopicHandoff` on `broker.topics.handoff`), on
 * the embedded bus: a replica refuses a topic that is not the asker's with its typed failure, and
 * an ask that nobody serves fails as `PeerUnavailable`. The hand-off that succeeds is
 * `mcpx-handoff.test.ts`'s, between real replicas on NATS.
 */
import { describe, expect, it } from "@effect/vitest"
import { Broker } from "@switchboard/broker"
import { Bus, MemoryBus, Peer, Subjects } from "@switchboard/bus"
import { Mcpx } from "@switchboard/protocol"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { busLayer, stack } from "./support/Stack.ts"

const brokerPeers = Peer.protocol(Mcpx.BrokerPeer)
const handoff = (topic: string) => new Mcpx.TopicHandoff({ topic, from: "a-replica-that-never-claimed-it", token: "t1", delivered: 0, members: [] })

describe("the broker's topic hand-off ask", () => {
  it.scopedLive("a replica refuses a topic whose claim is not the asker's, with the typed refusal", () =>
    Effect.gen(function*() {
      const ctx = yield* Layer.build(stack(busLayer(), { services: Broker.layer }))
      const refused = yield* Effect.flip(brokerPeers.call(Subjects.topicHandoff, handoff("nobody-claimed-this"), { timeout: "5 seconds" })).pipe(
        Effect.provideService(Bus.Bus, Context.get(ctx, Bus.Bus))
      )
      expect(refused).toBeInstanceOf(Mcpx.TopicHandoffRefused)
      expect(refused).toMatchObject({ _tag: "TopicHandoffRefused", reason: "the topic is not the asking replica's" })
    }))

  it.scopedLive("with no broker replica to ask, the ask fails PeerUnavailable (NoResponders) at once", () =>
    Effect.gen(function*() {
      const bus = Context.get(yield* Layer.build(MemoryBus.layer), Bus.Bus)
      const failed = yield* Effect.flip(brokerPeers.call(Subjects.topicHandoff, handoff("t"), { timeout: "5 seconds" })).pipe(Effect.provideService(Bus.Bus, bus))
      expect(failed).toBeInstanceOf(Peer.PeerUnavailable)
      expect(failed).toMatchObject({ reason: "NoResponders" })
    }))
})
