/**
 * Reclaiming topics from broker replicas that are gone. A sequencer's replica that dies leaves its
 * claim behind: a replica setting the topic up takes the claim over once the holder neither has a
 * liveness key nor answers, and replays the history from the last sequence the holder recorded,
 * which every sequencer records every RECORD_DELIVERED. And since nothing may set a topic up when
 * every participant's actor lives elsewhere, each replica makes sure its participants' topics are
 * sequenced whenever a broker replica lapses.
 */
import { type Bus, type Kv, Liveness, Subjects } from "@switchboard/bus"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import { holderOf, type Replica } from "./Replica.ts"
import type { Sequencers } from "./Sequencers.ts"

/**
 * How often a sequencer records the last history sequence it sent out. A sequencer that dies
 * without a word leaves its successor to replay from the last record, so members may get the
 * envelopes of up to this long before the death twice (same envelope id); one KV write per busy
 * topic per interval keeps the cost off the per-envelope path.
 */
const RECORD_DELIVERED = "250 millis"

/**
 * Claims `topic` for this replica: `created` when nobody held it; `ours` when it was this
 * replica's already or its holder is gone and this replica took it over (its members are in KV);
 * `elsewhere` when a live replica holds it, or won it meanwhile.
 */
export const claim = (
  replica: { readonly bus: Bus.BusShape; readonly claims: Kv.KvBucketShape; readonly replicas: Kv.KvBucketShape; readonly id: string },
  topic: string
) =>
  Effect.gen(function*() {
    const { bus, claims, replicas } = replica
    const key = Subjects.Key.topic(topic)
    const created = yield* Effect.either(claims.create(key, replica.id))
    if (Either.isRight(created)) return "created" as const
    const current = yield* claims.get(key)
    const holder = Option.map(current, (c) => holderOf(c.value))
    // A holder whose key lapsed (its heartbeat writes failed through a NATS election) may still
    // sequence: it is asked before the topic is taken from it, or the topic would have two.
    const alive = Option.isSome(holder)
      ? Option.isSome(yield* replicas.get(Subjects.Key.replica("broker", holder.value))) || (yield* Liveness.answers(bus, "broker", holder.value))
      : false
    const mine = Option.isSome(holder) && holder.value === replica.id
    const takeover = !mine && !alive && Option.isSome(current)
      ? Either.isRight(yield* Effect.either(claims.update(key, replica.id, current.value.revision)))
      : false
    return mine || takeover ? "ours" as const : "elsewhere" as const
  })

/** Records what each sequencer sent out, and takes over the topics of broker replicas that lapse. */
export const watch = (replica: Replica, sequencers: Sequencers) =>
  Effect.gen(function*() {
    const { sequenced } = replica
    yield* Effect.suspend(() =>
      Effect.forEach(
        [...sequenced.values()].filter((t) => t.phase === "owner"),
        (t) => t.recordDelivered.pipe(Effect.catchAll((e) => Effect.logWarning(`could not record what topic ${t.name} sent out`, e))),
        { discard: true }
      )
    ).pipe(Effect.repeat(Schedule.spaced(RECORD_DELIVERED)), Effect.forkScoped)

    let aliveBrokers: ReadonlySet<string> | undefined
    yield* Effect.gen(function*() {
      const alive = new Set(yield* replica.replicas.keys(Subjects.Key.replicas("broker")))
      const lapsed = aliveBrokers !== undefined && [...aliveBrokers].some((r) => !alive.has(r))
      aliveBrokers = alive
      if (!lapsed || replica.stopping) return
      for (const topic of replica.localTopics.keys()) {
        if (!sequenced.has(topic)) yield* sequencers.ensure(topic).pipe(Effect.catchAll((e) => Effect.logWarning(`could not take topic ${topic} over`, e)))
      }
    }).pipe(
      Effect.catchAll((e) => Effect.logWarning("sequencer sweep failed", e)),
      Effect.repeat(Schedule.spaced(replica.config.replicaHeartbeat)),
      Effect.forkScoped
    )
  })
