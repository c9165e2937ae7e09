/**
 * The MCPx v0.1 topic broker. Each socket is a participant actor, admitted by `Admission.ts` and
 * run by `Participant.ts`: it checks every envelope and appends the accepted ones to the topic's
 * history, whose order is the topic's total order. One sequencer per topic (`TopicSequencer.ts`,
 * set up by `Sequencers.ts`), claimed in KV, follows the history and fans each envelope out; it
 * gives an idle topic up (`TopicRelease.ts`), hands its topics on when the replica stops
 * (`TopicTransfer.ts`), and takes over those of replicas that died (`StaleBrokers.ts`). This
 * module only wires them, over the replica's shared state (`Replica.ts`).
 */
import { Actors } from "@switchboard/bus"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Admission from "./Admission.ts"
import * as AdminApi from "./AdminApi.ts"
import * as Replica from "./Replica.ts"
import * as Sequencers from "./Sequencers.ts"
import * as StaleBrokers from "./StaleBrokers.ts"
import * as TopicRelease from "./TopicRelease.ts"
import * as TopicTransfer from "./TopicTransfer.ts"

export const make = Effect.gen(function*() {
  const replica = yield* Replica.make
  const sequencers = Sequencers.make(replica, TopicRelease.make(replica))
  yield* StaleBrokers.watch(replica, sequencers)
  const handTopicsOn = yield* TopicTransfer.make(replica, sequencers)
  yield* Actors.host({
    service: "broker",
    replica: replica.id,
    replicaHeartbeat: replica.config.replicaHeartbeat,
    protocol: AdminApi.participantPeers,
    make: Admission.make(replica, sequencers),
    beforeHandoff: handTopicsOn
  })
})

export const layer = Layer.merge(Layer.scopedDiscard(make), AdminApi.layer)
