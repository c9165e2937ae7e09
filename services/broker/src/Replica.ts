/**
 * What one broker replica shares among its roles: settings, the topics' history, the KV buckets of
 * claims, replicas and members, the link to the edges, and which topics it sequences or is setting
 * up. Built once per replica (`Broker.ts`); each role (`Sequencers.ts`, `TopicRelease.ts`,
 * `TopicTransfer.ts`, `StaleBrokers.ts`, `Admission.ts`) takes what it needs from it.
 */
import { Actors, Bus, Journal, Kv, Peer, Subjects } from "@switchboard/bus"
import { Mcpx } from "@switchboard/protocol"
import { Telemetry } from "@switchboard/telemetry"
import type * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as FiberSet from "effect/FiberSet"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import * as BrokerConfig from "./Config.ts"
import type { TopicSequencer } from "./TopicSequencer.ts"

/** What reaches a topic's sequencer on its subject, besides the history. */
const topicEvents = Peer.protocol(Mcpx.TopicEvent)

const decoder = new TextDecoder()
/** A claim's value: the id of the replica that holds it. */
export const holderOf = (value: Uint8Array) => decoder.decode(value)

export const make = Effect.gen(function*() {
  const bus = yield* Bus.Bus
  const kv = yield* Kv.Kv
  const link = yield* Actors.edgeLink
  const config = {
    mode: yield* BrokerConfig.mode,
    topicModes: yield* BrokerConfig.topicModes,
    rate: yield* BrokerConfig.rate,
    burst: yield* BrokerConfig.burst,
    chatRate: yield* BrokerConfig.chatRate,
    chatBurst: yield* BrokerConfig.chatBurst,
    maxEnvelope: yield* BrokerConfig.maxEnvelope,
    maxParticipants: yield* BrokerConfig.maxParticipants,
    history: yield* BrokerConfig.history,
    topicIdle: yield* BrokerConfig.topicIdle,
    replicaHeartbeat: yield* BrokerConfig.replicaHeartbeat
  }
  if (Option.isSome(yield* BrokerConfig.removedHistoryBytes)) {
    yield* Effect.logWarning("MCPX_HISTORY_BYTES is no longer used: MCPX_HISTORY_LIMIT bounds each topic's history, MCPX_HISTORY_TOTAL_BYTES all of them")
  }
  const history: Journal.JournalLog = yield* (yield* Journal.Journal).open(config.history)
  const claims = yield* kv.bucket(Subjects.Bucket.topics)
  const replicas = yield* kv.bucket(Subjects.Bucket.replicas)
  const members = Kv.typed(yield* kv.bucket(Subjects.Bucket.members), Mcpx.Member)
  // The sequencers' subscriptions live in a scope of their own, closed after the actor host's
  // hand-off: a child of the layer's scope forked later would close before it, and a stopping
  // replica would have no sequencer left to hand on.
  const scope = yield* Effect.acquireRelease(Scope.make(), (s) => Scope.close(s, Exit.void))
  /** Runs work that starts outside any Effect (bus callbacks, timers) until the broker stops. */
  const run = yield* FiberSet.runtime(yield* FiberSet.make())<never>()
  const { tracer } = yield* Telemetry.Tracing
  /** This replica's id, the value of its claims. */
  const id: string = randomUUID()

  const toTopic = (topic: string, event: Peer.Tell<Mcpx.TopicEvent>, traceparent?: string) =>
    topicEvents.publish(bus, Subjects.topic(topic), event, traceparent)
  /** A message on a topic's subject, typed; one that does not decode is logged and dropped. */
  const topicEvent = (message: Bus.BusMessage): Mcpx.TopicEvent | undefined => {
    const event = topicEvents.decode(message)
    if (Either.isRight(event)) return event.right
    run(Effect.logWarning(`dropped a message on ${message.subject}: ${event.left}`))
  }

  return {
    bus,
    link,
    config,
    history,
    claims,
    replicas,
    members,
    tracer,
    id,
    scope,
    run,
    toTopic,
    topicEvent,
    /** Topics this replica sequences. */
    sequenced: new Map<string, TopicSequencer>(),
    /** Topics whose sequencer this replica is setting up; later joins wait for it. */
    settingUp: new Map<string, Deferred.Deferred<void>>(),
    /** Topics with participants whose actors live here, and how many. */
    localTopics: new Map<string, number>(),
    /** This replica stops: it takes on no topic, and hands its own on. */
    stopping: false
  }
})

export type Replica = Effect.Effect.Success<typeof make>

/** Forgets `topic` as one this replica sequences, unless a newer sequencer has its name already. */
export const forget = (replica: Pick<Replica, "sequenced">, topic: TopicSequencer) => {
  if (replica.sequenced.get(topic.name) === topic) replica.sequenced.delete(topic.name)
}
