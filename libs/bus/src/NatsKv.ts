/**
 * The NATS adapter of the Kv port, over JetStream KV buckets named under the namespace. Writes ride
 * out a stream leader election, listings and watches are bounded where nats.js can wait for a
 * heartbeat, and `follow` is the port's watch-based one.
 */
import { JetStreamApiCodes, JetStreamApiError, type JetStreamManager } from "@nats-io/jetstream"
import { Kvm, KvWatchInclude, type KV, type KvEntry as NatsKvEntry } from "@nats-io/kv"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Stream from "effect/Stream"
import { BusError } from "./Bus.ts"
import { watchConsumer } from "./internal/NatsShims.ts"
import { followByWatch, KvConflict, type KvBucketShape, type KvEntry, type KvShape } from "./Kv.ts"
import type { NatsLink } from "./NatsConnection.ts"
import { awaitingJetStream, busError, DEFAULT_JETSTREAM_WAIT, isUnavailableOrTimedOut, whileJetStreamUnavailable } from "./NatsFailures.ts"

export const DEFAULT_KV_WRITE_RETRY = "10 seconds"

const isConflict = (e: unknown) =>
  e instanceof JetStreamApiError &&
  (e.code === JetStreamApiCodes.StreamWrongLastSequence || e.code === JetStreamApiCodes.StreamWrongLastSequenceUnknown)

const toEntry = (e: NatsKvEntry): KvEntry => ({
  key: e.key,
  value: e.value,
  revision: e.revision,
  operation: e.operation === "PUT" ? "PUT" : "DEL"
})

const KEYS_BOUND = "250 millis"

/**
 * How often a KV watch asks whether its consumer still exists, and after how many failed asks in a
 * row it fails, for its user to watch again. nats.js replaces a watch's consumer that died with its
 * node only after two missed 30 s heartbeats: the chaos suite's /hub sessions did not see a tab
 * that registered again for 60 s after a NATS node was killed. The cost: one JetStream API request
 * per watch every 5 s (a registry replica has two).
 */
const WATCH_CHECK = "5 seconds"
const WATCH_LOST_AFTER = 2

/** `full` is the bucket's namespaced name, whose stream is `KV_<full>`. */
const makeBucket = (name: string, full: string, kv: KV, jsm: () => Promise<JetStreamManager>, writeRetry: Duration.DurationInput): KvBucketShape => {
  const write = whileJetStreamUnavailable(writeRetry)
  // A put or delete that timed out (its leader died before acknowledging it) may have been applied
  // or not; doing it again leaves the same state, so it is tried again too. A compare-and-set is
  // not: done twice, it would conflict with itself.
  const idempotentWrite = whileJetStreamUnavailable(writeRetry, isUnavailableOrTimedOut)
  const kvError = (what: string) => busError("Kv", `${what} on bucket ${name}`)
  const streamName = `KV_${full}`
  const lastSeq = async () => (await (await jsm()).streams.info(streamName)).state.last_seq
  const prefix = `$KV.${full}.`
  /** The keys under `filter` that have a message in the stream (a delete marker too): one request. */
  const storedKeys = async (filter: string) => {
    const info = await (await jsm()).streams.info(streamName, { subjects_filter: prefix + filter })
    return Object.keys(info.state.subjects ?? {}).map((subject) => subject.slice(prefix.length))
  }
  /** The keys among the stream's subjects that `known` lacks and that are live (a get each). */
  const liveFromSubjects = async (filter: string, known: ReadonlySet<string>) => {
    const keys = await Promise.all(
      (await storedKeys(filter)).map(async (key) => {
        if (known.has(key)) return undefined
        const e = await kv.get(key)
        return e !== null && e.operation === "PUT" ? key : undefined
      })
    )
    return keys.filter((k) => k !== undefined)
  }
  const claim = <A>(what: string, key: string, reason: KvConflict["reason"], op: () => Promise<A>) =>
    Effect.tryPromise({
      try: op,
      catch: (e): KvConflict | BusError => (isConflict(e) ? new KvConflict({ key, reason }) : kvError(`${what} ${key}`)(e))
    })
  const shape: Omit<KvBucketShape, "follow"> = {
    name,
    get: (key) =>
      Effect.tryPromise({ try: () => kv.get(key), catch: kvError(`get ${key}`) }).pipe(
        Effect.map((e) => (e !== null && e.operation === "PUT" ? Option.some(toEntry(e)) : Option.none()))
      ),
    // Writes ride out a leader election: a heartbeat that fails for its whole duration lets the
    // replica's key lapse, and survivors adopt connections that are still served.
    put: (key, value) => idempotentWrite(Effect.tryPromise({ try: () => kv.put(key, value), catch: kvError(`put ${key}`) })),
    create: (key, value) => write(claim("create", key, "Exists", () => kv.create(key, value))),
    update: (key, value, revision) => write(claim("update", key, "WrongRevision", () => kv.update(key, value, revision))),
    delete: (key) => idempotentWrite(Effect.tryPromise({ try: () => kv.delete(key), catch: kvError(`delete ${key}`) })),
    compareAndDelete: (key, revision) => write(claim("delete", key, "WrongRevision", () => kv.delete(key, { previousSeq: revision }))),
    keys: (filter) =>
      Effect.tryPromise({
        try: async (signal) => {
          const before = await lastSeq()
          const it = await kv.keys(filter ?? ">")
          signal.addEventListener("abort", () => it.stop())
          // A key rewritten during the listing can be listed twice.
          const out = new Set<string>()
          for await (const k of it) out.add(k)
          if ((await lastSeq()) === before) return [...out]
          // Written to meanwhile: a key rewritten after its old entry was dropped and before the
          // listing ended comes after the end, and was missed. The subjects have every live key.
          return [...out, ...(await liveFromSubjects(filter ?? ">", out))]
        },
        catch: kvError("keys")
      }).pipe(
        // nats.js ends a listing at the message that says nothing more is pending. When keys are
        // rewritten during the listing, nats-server 2.9 can say 1 on the last one, and the listing
        // then waits for an idle heartbeat (5 to 30 s). Past a bound, the stream's subjects are
        // read instead (one request), and each is checked to be live.
        Effect.timeout(KEYS_BOUND),
        Effect.catchTag("TimeoutException", () =>
          Effect.tryPromise({ try: () => liveFromSubjects(filter ?? ">", new Set()), catch: kvError("keys") }))
      ),
    count: (filter) => Effect.tryPromise({ try: async () => (await storedKeys(filter ?? ">")).length, catch: kvError("count") }),
    // The iterator is pumped by a plain loop and stopped by the scope: an Effect fiber parked in
    // `next()` could not be interrupted until the next change arrived.
    watch: (options) =>
      Stream.asyncScoped<KvEntry, BusError>((emit) =>
        Effect.acquireRelease(
          Effect.tryPromise({
            try: () =>
              kv.watch({
                key: options?.key ?? ">",
                include: options?.initial ? KvWatchInclude.LastValue : KvWatchInclude.UpdatesOnly
              }),
            catch: kvError("watch")
          }),
          (it) => Effect.sync(() => it.stop())
        ).pipe(
          Effect.tap((it) =>
            Effect.sync(() => {
              const pump = async () => {
                for await (const e of it) await emit.single(toEntry(e))
                await emit.end()
              }
              pump().catch((cause: unknown) => emit.fail(kvError("watch")(cause)))
            })
          ),
          Effect.tap((it) => {
            const consumer = watchConsumer(it)
            if (consumer === undefined) return Effect.void
            let failed = 0
            return Effect.promise(() => consumer.info().then(() => true, () => false)).pipe(
              Effect.flatMap((found) => {
                failed = found ? 0 : failed + 1
                if (failed < WATCH_LOST_AFTER) return Effect.void
                return Effect.promise(() => emit.fail(new BusError({ reason: "Kv", message: `watch on bucket ${name}: its consumer is gone` })))
              }),
              Effect.repeat(Schedule.spaced(WATCH_CHECK)),
              Effect.forkScoped
            )
          })
        )
      )
  }
  return { ...shape, follow: followByWatch(shape) }
}

/**
 * Scales an existing stream up to `replicas`, never down: a stream an operator raised by hand, or
 * one a newer replica of this service already raised during a rolling upgrade, keeps its copies.
 */
const atLeastReplicas = async (m: JetStreamManager, stream: string, replicas: number) => {
  const { config } = await m.streams.info(stream)
  if (config.num_replicas < replicas) await m.streams.update(stream, { ...config, num_replicas: replicas })
}

export const makeKv = (
  { jsm, namespace, nc }: NatsLink,
  replicas = 1,
  waits: { readonly jetStream?: Duration.DurationInput; readonly writes?: Duration.DurationInput } = {}
): KvShape => {
  const kvm = new Kvm(nc)
  return {
    bucket: (spec) =>
      Effect.tryPromise({
        try: async () => {
          const full = `${namespace}_${spec.name}`
          const options = {
            history: spec.history ?? 1,
            replicas,
            ...(spec.ttl === undefined ? {} : { ttl: Duration.toMillis(Duration.decode(spec.ttl)) })
          }
          // Two processes creating the same bucket at once: one wins, the other opens it.
          const kv = await kvm.create(full, options).catch((e: unknown) => {
            if (e instanceof Error && /already in use/i.test(e.message)) return kvm.open(full)
            throw e
          })
          // Creating an existing bucket keeps its settings: one made with fewer replicas is scaled up.
          if (replicas > 1) await atLeastReplicas(await jsm(), `KV_${full}`, replicas)
          return makeBucket(spec.name, full, kv, jsm, waits.writes ?? DEFAULT_KV_WRITE_RETRY)
        },
        catch: busError("Kv", `open bucket ${spec.name}`)
      }).pipe(awaitingJetStream(`opening bucket ${spec.name}`, waits.jetStream ?? DEFAULT_JETSTREAM_WAIT))
  }
}
