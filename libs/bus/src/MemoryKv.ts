/**
 * The embedded adapter of the Kv port: buckets in this process's memory, with revisions, TTL and
 * watchers called by the write itself. Values are held in the form that costs least for as long
 * as a key lives, since a connection's records live as long as its socket.
 */
import * as Chunk from "effect/Chunk"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Stream from "effect/Stream"
import { type BusError, subjectMatches } from "./Bus.ts"
import { KvConflict, type KvBucketShape, type KvEntry, type KvShape } from "./Kv.ts"

const kvEncoder = new TextEncoder()

/**
 * A KV value lives as long as its key (a connection's record, as long as the socket), so it is
 * kept in the form that costs least for that long. Services put JSON text: kept as the string it
 * is, 16 bytes of header on its characters, where bytes of their own cost a Uint8Array, an
 * ArrayBuffer and a malloc'd backing store, about 300 bytes more per record and two to three
 * records per idle connection (issue 16). Its bytes are made again on each read, which is rare
 * next to how long a record lives. Bytes that are given are copied: a short string's bytes from
 * Buffer.from are a slice of Node's shared 8 KiB pool, and keeping the slice would keep the whole
 * slab alive.
 */
type Held = string | Uint8Array
const hold = (data: Uint8Array | string): Held => (typeof data === "string" || data.byteLength === data.buffer.byteLength ? data : new Uint8Array(data))
const bytesOf = (held: Held): Uint8Array => (typeof held === "string" ? kvEncoder.encode(held) : held)

/** A live value; deleted keys are not stored. */
interface Stored {
  readonly held: Held
  readonly revision: number
  readonly at: number
}

/** An entry as a reader sees it: its bytes are made when read. */
class HeldEntry implements KvEntry {
  constructor(
    readonly key: string,
    private readonly held: Held,
    readonly revision: number,
    readonly operation: "PUT" | "DEL"
  ) {}
  get value() {
    return bytesOf(this.held)
  }
}

interface Watcher {
  readonly filter: string
  readonly emit: (entry: KvEntry) => void
}

const makeBucket = (name: string, ttl: Option.Option<Duration.Duration>): KvBucketShape => {
  const entries = new Map<string, Stored>()
  const watchers = new Set<Watcher>()
  let revision = 0
  const ttlMillis = Option.map(ttl, Duration.toMillis)

  const live = (key: string): Stored | undefined => {
    const e = entries.get(key)
    if (!e) return undefined
    if (Option.isSome(ttlMillis) && Date.now() - e.at >= ttlMillis.value) {
      entries.delete(key)
      return undefined
    }
    return e
  }

  const write = (key: string, held: Held, operation: "PUT" | "DEL"): number => {
    revision += 1
    // A deleted key is forgotten, not kept as a tombstone: nothing reads one (a deleted key reads
    // as absent either way), and services delete a key per closed connection.
    if (operation === "DEL") entries.delete(key)
    else entries.set(key, { held, revision, at: Date.now() })
    if (watchers.size === 0) return revision
    const entry = new HeldEntry(key, held, revision, operation)
    for (const w of watchers) if (subjectMatches(w.filter, key)) w.emit(entry)
    return revision
  }

  const liveKeys = (filter = ">") => [...entries.keys()].filter((k) => live(k) !== undefined && subjectMatches(filter, k))

  const current = (filter: string) => {
    const found: Array<KvEntry> = []
    for (const key of entries.keys()) {
      const e = live(key)
      if (e && subjectMatches(filter, key)) found.push(new HeldEntry(key, e.held, e.revision, "PUT"))
    }
    return found
  }

  return {
    name,
    get: (key) =>
      Effect.sync(() => {
        const e = live(key)
        return e ? Option.some<KvEntry>(new HeldEntry(key, e.held, e.revision, "PUT")) : Option.none()
      }),
    put: (key, value) => Effect.sync(() => write(key, hold(value), "PUT")),
    create: (key, value) =>
      Effect.suspend(() =>
        live(key) ? Effect.fail(new KvConflict({ key, reason: "Exists" })) : Effect.succeed(write(key, hold(value), "PUT"))
      ),
    update: (key, value, expected) =>
      Effect.suspend(() => {
        const e = live(key)
        return e?.revision !== expected
          ? Effect.fail(new KvConflict({ key, reason: "WrongRevision" }))
          : Effect.succeed(write(key, hold(value), "PUT"))
      }),
    delete: (key) =>
      Effect.sync(() => {
        if (entries.has(key)) write(key, "", "DEL")
      }),
    compareAndDelete: (key, expected) =>
      Effect.suspend(() => {
        if (live(key)?.revision !== expected) return Effect.fail(new KvConflict({ key, reason: "WrongRevision" }))
        write(key, "", "DEL")
        return Effect.void
      }),
    keys: (filter) => Effect.sync(() => liveKeys(filter)),
    count: (filter) => Effect.sync(() => liveKeys(filter).length),
    watch: (options) =>
      Stream.asyncScoped<KvEntry, BusError>((emit) =>
        Effect.acquireRelease(
          Effect.sync(() => {
            const filter = options?.key ?? ">"
            if (options?.initial) void emit.chunk(Chunk.unsafeFromArray(current(filter)))
            const w = { filter, emit: (entry: KvEntry) => void emit.single(entry) }
            watchers.add(w)
            return w
          }),
          (w) => Effect.sync(() => watchers.delete(w))
        )
      ),
    // No stream and no fiber: a watcher in the set, called by the write itself. The registry
    // follows two buckets per user; as watch streams read by fibers they cost about 85 KB a user
    // (issue 16).
    follow: (filter, apply) =>
      Effect.acquireRelease(
        Effect.sync(() => {
          for (const entry of current(filter)) apply(entry)
          const w: Watcher = { filter, emit: apply }
          watchers.add(w)
          return w
        }),
        (w) => Effect.sync(() => watchers.delete(w))
      ).pipe(Effect.asVoid)
  }
}

export const makeKv = (): KvShape => {
  const buckets = new Map<string, KvBucketShape>()
  return {
    bucket: (spec) =>
      Effect.sync(() => {
        const existing = buckets.get(spec.name)
        if (existing) return existing
        const bucket = makeBucket(spec.name, Option.map(Option.fromNullable(spec.ttl), Duration.decode))
        buckets.set(spec.name, bucket)
        return bucket
      })
  }
}
