/**
 * The key-value port, shaped after JetStream KV: `create` is an exclusive claim, `update` is
 * compare-and-set on a revision, buckets may expire entries after a TTL, and `watch` streams
 * changes. Keys are `.`-separated tokens, so `keys` and `watch` take subject-style filters.
 */
import * as Context from "effect/Context"
import * as Data from "effect/Data"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import * as Stream from "effect/Stream"
import type { BusError } from "./Bus.ts"

export interface KvEntry {
  readonly key: string
  readonly value: Uint8Array
  readonly revision: number
  readonly operation: "PUT" | "DEL"
}

/** `create` found the key present, or `update`'s revision was not the latest. */
export class KvConflict extends Data.TaggedError("KvConflict")<{
  readonly key: string
  readonly reason: "Exists" | "WrongRevision"
}> {}

/**
 * A bucket's definition. Every process that opens a bucket must pass the same one (they are
 * declared once, in `Subjects.Bucket`): on NATS the first creator's settings win.
 */
export interface BucketSpec {
  readonly name: string
  /** Entries older than this are removed. */
  readonly ttl?: Duration.DurationInput
  readonly history?: number
}

export interface WatchOptions {
  /** A subject-style key filter; all keys when omitted. */
  readonly key?: string
  /** Replay the latest value of every matching key before live updates. */
  readonly initial?: boolean
}

export interface KvBucketShape {
  readonly name: string
  /** The latest live value; deleted and expired keys are `None`. */
  readonly get: (key: string) => Effect.Effect<Option.Option<KvEntry>, BusError>
  readonly put: (key: string, value: Uint8Array | string) => Effect.Effect<number, BusError>
  readonly create: (key: string, value: Uint8Array | string) => Effect.Effect<number, KvConflict | BusError>
  readonly update: (key: string, value: Uint8Array | string, revision: number) => Effect.Effect<number, KvConflict | BusError>
  readonly delete: (key: string) => Effect.Effect<void, BusError>
  /**
   * Deletes the key only while `revision` is its latest: compare-and-delete, as `update` is
   * compare-and-set. A record read and then deleted by its owner, once it ends, must not take with
   * it a newer one that another wrote meanwhile.
   */
  readonly compareAndDelete: (key: string, revision: number) => Effect.Effect<void, KvConflict | BusError>
  readonly keys: (filter?: string) => Effect.Effect<ReadonlyArray<string>, BusError>
  /**
   * How many keys that match `filter` hold an entry, in one request: for a bound checked on a hot
   * path, where `keys` would list them all. On NATS a deleted key counts until its delete marker
   * ages out, so this is at least the live count, and equal to it where keys are not deleted.
   */
  readonly count: (filter?: string) => Effect.Effect<number, BusError>
  readonly watch: (options?: WatchOptions) => Stream.Stream<KvEntry, BusError>
  /**
   * Hands `apply` the latest value of every key that matches `filter`, then every change, until
   * the scope closes, and returns once the values there were are applied. It never fails: a watch
   * that NATS loses is made again, and replays each key's latest value. `apply` is called outside
   * any fiber, in order, and must not throw.
   */
  readonly follow: (filter: string, apply: (entry: KvEntry) => void) => Effect.Effect<void, never, Scope.Scope>
}

export interface KvShape {
  /** Opens a bucket, creating it when missing. */
  readonly bucket: (spec: BucketSpec) => Effect.Effect<KvBucketShape, BusError>
}

export class Kv extends Context.Tag("@switchboard/bus/Kv")<Kv, KvShape>() {}

/** A bucket whose values are JSON documents of one Schema. */
export interface TypedBucket<A> {
  readonly raw: KvBucketShape
  readonly get: (key: string) => Effect.Effect<Option.Option<{ readonly value: A; readonly revision: number }>, BusError>
  readonly put: (key: string, value: A) => Effect.Effect<number, BusError>
  readonly create: (key: string, value: A) => Effect.Effect<number, KvConflict | BusError>
  readonly update: (key: string, value: A, revision: number) => Effect.Effect<number, KvConflict | BusError>
  readonly delete: (key: string) => Effect.Effect<void, BusError>
  /**
   * Deletes the key's record if `owns` says it is still the caller's, and only the revision it
   * read: a newer record written meanwhile (a reconnected socket's) stays. True when it deleted.
   */
  readonly deleteOwned: (key: string, owns: (value: A) => boolean) => Effect.Effect<boolean, BusError>
  readonly keys: (filter?: string) => Effect.Effect<ReadonlyArray<string>, BusError>
  readonly count: (filter?: string) => Effect.Effect<number, BusError>
  readonly values: (filter?: string) => Effect.Effect<ReadonlyArray<{ readonly key: string; readonly value: A }>, BusError>
}

/**
 * `follow` through `watch`, for a bucket whose watch can fail (NATS): the watch, made again after
 * a failure, and the keys read once, since a watch does not mark where its replay ends. A key read
 * that fails only makes the values there were arrive with the watch's replay instead.
 */
export const followByWatch = (bucket: Pick<KvBucketShape, "name" | "watch" | "keys" | "get">): KvBucketShape["follow"] => (filter, apply) =>
  Effect.gen(function*() {
    yield* bucket.watch({ key: filter, initial: true }).pipe(
      Stream.runForEach((e) => Effect.sync(() => apply(e))),
      // A watch fails when NATS cannot answer for a while (a node died, a leader is elected).
      Effect.tapError((e) => Effect.logWarning(`lost the watch of ${filter} in ${bucket.name}; watching again`, e)),
      Effect.retry(Schedule.exponential("200 millis").pipe(Schedule.union(Schedule.spaced("5 seconds")))),
      Effect.catchAllCause((cause) => Effect.logError(`stopped following ${filter} in ${bucket.name}`, cause)),
      Effect.forkScoped
    )
    for (const key of yield* bucket.keys(filter)) {
      const entry = yield* bucket.get(key)
      if (Option.isSome(entry)) apply(entry.value)
    }
  }).pipe(Effect.catchAllCause((cause) => Effect.logWarning(`could not read ${filter} in ${bucket.name}; its values arrive with the watch`, cause)))

const decoder = new TextDecoder()

/**
 * A bucket of `schema`'s values, as JSON. `encodeFast` writes a value in place of the Schema's
 * encode, for a record written once per connection (`SessionStore.connectionRecords`): it must
 * write what the Schema writes, tested against it.
 */
export const typed = <A, I>(bucket: KvBucketShape, schema: Schema.Schema<A, I>, encodeFast?: (value: A) => string): TypedBucket<A> => {
  const codec = Schema.parseJson(schema)
  const encode = encodeFast ?? Schema.encodeSync(codec)
  const decode = Schema.decodeUnknownOption(codec)
  const read = (entry: KvEntry) => decode(decoder.decode(entry.value))
  const get = (key: string) =>
    Effect.map(bucket.get(key), (entry) =>
      Option.flatMap(entry, (e) => Option.map(read(e), (value) => ({ value, revision: e.revision })))
    )
  return {
    raw: bucket,
    get,
    put: (key, value) => bucket.put(key, encode(value)),
    create: (key, value) => bucket.create(key, encode(value)),
    update: (key, value, revision) => bucket.update(key, encode(value), revision),
    delete: bucket.delete,
    deleteOwned: (key, owns) =>
      Effect.flatMap(get(key), (found) =>
        Option.isSome(found) && owns(found.value.value)
          ? bucket.compareAndDelete(key, found.value.revision).pipe(Effect.as(true), Effect.catchTag("KvConflict", () => Effect.succeed(false)))
          : Effect.succeed(false)),
    keys: bucket.keys,
    count: bucket.count,
    // Documents that no longer decode (an older shape) are skipped rather than failing the read.
    values: (filter) =>
      Effect.flatMap(bucket.keys(filter), (keys) =>
        Effect.map(
          Effect.forEach(keys, (key) => Effect.map(get(key), Option.map(({ value }) => ({ key, value }))), {
            concurrency: 16
          }),
          (found) => found.flatMap(Option.toArray)
        )
      )
  }
}
