/**
 * The embedded bus and KV: the same ports as NATS, in one process, for `npm start` without a
 * `NATS_URL` and for logic-only tests. Delivery is asynchronous and FIFO across the whole bus (one
 * microtask-batched queue), so a handler that publishes never re-enters another handler, and
 * per-publisher order holds as it does on NATS.
 */
import * as Chunk from "effect/Chunk"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Stream from "effect/Stream"
import { randomUUID } from "node:crypto"
import { acquireReleaseSync } from "./ActorResource.ts"
import {
  Bus,
  BusError,
  type BusMessage,
  type BusShape,
  DEFAULT_REQUEST_TIMEOUT,
  type Headers,
  isWildcard,
  NoResponders,
  RequestTimeout,
  subjectMatches,
  type Subscription,
  toBytes
} from "./Bus.ts"
import { Journal, type JournalEntry, type JournalLog, type JournalShape, type JournalSpec } from "./Journal.ts"
import { Kv, KvConflict, type KvBucketShape, type KvEntry, type KvShape } from "./Kv.ts"

interface Subscriber {
  readonly subject: string
  readonly queue: string | undefined
  readonly handler: (message: BusMessage) => void
}

const noHeaders: Headers = {}

class Message implements BusMessage {
  constructor(
    readonly subject: string,
    readonly data: Uint8Array,
    readonly headers: Headers,
    readonly reply: string | undefined
  ) {}
  header(name: string): string | undefined {
    const value = this.headers[name]
    return value === "" ? undefined : value
  }
}

const closed = () => new BusError({ reason: "Closed", message: "the embedded bus is closed" })

/**
 * A subscription whose `drain` is built when asked for: an actor holds its subscription for the
 * connection's life and drains it only in a hand-off, and an Effect built up front was a few
 * hundred bytes of every idle connection (issue 16).
 */
class MemorySubscription implements Subscription {
  constructor(
    private readonly subscriber: Subscriber,
    private readonly remove: (s: Subscriber) => void
  ) {}
  get drain() {
    return Effect.sync(() => this.remove(this.subscriber))
  }
}

export const makeBus = (): BusShape => {
  // Exact subjects are looked up in a map: actors subscribe one subject per connection, and a
  // publish must not scan them all. Wildcard subscriptions are few and scanned.
  const exact = new Map<string, Array<Subscriber>>()
  const wildcard: Array<Subscriber> = []
  const roundRobin = new Map<string, number>()
  let pending: Array<Message> = []
  let scheduled = false
  let isClosed = false

  const matching = (subject: string): Array<Subscriber> => {
    const direct = exact.get(subject)
    if (wildcard.length === 0) return direct ?? []
    const found = direct ? direct.slice() : []
    for (const s of wildcard) if (subjectMatches(s.subject, subject)) found.push(s)
    return found
  }

  const deliver = (message: Message) => {
    const subscribers = matching(message.subject)
    let groups: Map<string, Array<Subscriber>> | undefined
    for (const s of subscribers) {
      if (s.queue === undefined) {
        s.handler(message)
      } else {
        groups ??= new Map()
        const members = groups.get(s.queue)
        if (members) members.push(s)
        else groups.set(s.queue, [s])
      }
    }
    if (groups) {
      for (const [queue, members] of groups) {
        // One member (every actor's subject, but during a hand-off): no turn to keep.
        if (members.length === 1) {
          members[0]!.handler(message)
          continue
        }
        const key = `${queue} ${message.subject}`
        const turn = roundRobin.get(key) ?? 0
        roundRobin.set(key, turn + 1)
        members[turn % members.length]!.handler(message)
      }
    }
  }

  const flush = () => {
    scheduled = false
    while (pending.length > 0) {
      const batch = pending
      pending = []
      for (const message of batch) {
        try {
          deliver(message)
        } catch (cause) {
          // A throwing handler is a bug in that handler; it must not stop delivery to others.
          console.error(`embedded bus: handler for ${message.subject} threw`, cause)
        }
      }
    }
  }

  const unsafePublish = (subject: string, data: Uint8Array | string, headers?: Headers, reply?: string) => {
    if (isClosed) throw closed()
    pending.push(new Message(subject, toBytes(data), headers ?? noHeaders, reply))
    if (!scheduled) {
      scheduled = true
      queueMicrotask(flush)
    }
  }

  const publish = (subject: string, data: Uint8Array | string, headers?: Headers) =>
    Effect.try({ try: () => unsafePublish(subject, data, headers), catch: () => closed() })

  const add = (s: Subscriber) => {
    if (isWildcard(s.subject)) {
      wildcard.push(s)
    } else {
      const list = exact.get(s.subject)
      if (list) list.push(s)
      else exact.set(s.subject, [s])
    }
  }
  const remove = (s: Subscriber) => {
    if (s.queue !== undefined) roundRobin.delete(`${s.queue} ${s.subject}`)
    if (isWildcard(s.subject)) {
      const i = wildcard.indexOf(s)
      if (i >= 0) wildcard.splice(i, 1)
      return
    }
    const list = exact.get(s.subject)
    if (!list) return
    const i = list.indexOf(s)
    if (i >= 0) list.splice(i, 1)
    if (list.length === 0) exact.delete(s.subject)
  }

  // Not Effect.acquireRelease: one subscription per connection, whose release needs no fiber refs of its own.
  const subscribe: BusShape["subscribe"] = (subject, handler, options) =>
    acquireReleaseSync(
      Effect.suspend(() => {
        if (isClosed) return Effect.fail(closed())
        const s: Subscriber = { subject, queue: options?.queue, handler }
        add(s)
        return Effect.succeed(s)
      }),
      remove
    ).pipe(
      // Deliveries are looked up when they run, so a member that leaves misses nothing: what was
      // published before goes to the members left.
      Effect.map((s) => new MemorySubscription(s, remove))
    )

  const stream: BusShape["stream"] = (subject, options) =>
    Stream.asyncScoped<BusMessage, BusError>((emit) =>
      subscribe(subject, (m) => void emit.single(m), options)
    )

  const request: BusShape["request"] = (subject, data, options) =>
    Effect.suspend((): Effect.Effect<BusMessage, NoResponders | RequestTimeout> => {
      if (matching(subject).length === 0) return Effect.fail(new NoResponders({ subject }))
      const timeout = Duration.decode(options?.timeout ?? DEFAULT_REQUEST_TIMEOUT)
      const inbox = `_INBOX.${randomUUID()}`
      // One callback and one timer, not a fiber racing a sleep: a request in flight holds only
      // these (a handshake asks twice, and thousands of handshakes may be in flight at once).
      return Effect.async<BusMessage, RequestTimeout>((resume) => {
        // The inbox goes as the answer arrives or the time is up: an inbox left in `exact` kept its
        // handler, the waiting fiber and the answer.
        const s: Subscriber = {
          subject: inbox,
          queue: undefined,
          handler: (m) => {
            clearTimeout(timer)
            remove(s)
            resume(Effect.succeed(m))
          }
        }
        const timer = setTimeout(() => {
          remove(s)
          resume(Effect.fail(new RequestTimeout({ subject, timeout })))
        }, Duration.toMillis(timeout))
        add(s)
        unsafePublish(subject, data, options?.headers, inbox)
        return Effect.sync(() => {
          clearTimeout(timer)
          remove(s)
        })
      })
    })

  const respond: BusShape["respond"] = (message, data, headers) =>
    message.reply === undefined ? Effect.void : publish(message.reply, data, headers)

  const drain = Effect.sync(() => {
    if (isClosed) return
    flush()
    isClosed = true
    exact.clear()
    wildcard.length = 0
  })

  return { publish, unsafePublish, subscribe, stream, request, respond, flush: Effect.void, drain, shared: false, isConnected: () => !isClosed, onReconnect: () => Effect.void }
}

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
    keys: (filter) =>
      Effect.sync(() => [...entries.keys()].filter((k) => live(k) !== undefined && subjectMatches(filter ?? ">", k))),
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

const journalEncoder = new TextEncoder()
/**
 * Entries are kept for hours, so each gets bytes of its own: a view into Node's shared pool (what
 * `Buffer.from` gives short strings) would keep that pool's whole 8 KiB slab alive.
 */
const ownBytes = (data: Uint8Array | string): Uint8Array =>
  typeof data === "string" ? journalEncoder.encode(data) : data.byteLength === data.buffer.byteLength ? data : new Uint8Array(data)

/** One key of an embedded journal: its entries oldest first, and who follows it. */
interface Key {
  readonly name: string
  readonly entries: Array<JournalEntry>
  readonly followers: Set<(entry: JournalEntry) => void>
}

/**
 * What the budget charges an entry besides its bytes: its object, its Uint8Array and ArrayBuffer,
 * their backing store and its two index slots (about 350 bytes measured on Node 20 in
 * JournalMemory.test.ts, rounded up). Without it, a budget of small entries held several times
 * its size.
 */
const ENTRY_OVERHEAD = 400

/** The journal's order index names an entry without holding it, so a dropped entry's bytes go at once. */
interface OrderSlot {
  readonly key: Key
  readonly seq: number
}

/**
 * A journal in this process's memory with JetStream's semantics: one sequence across its keys, a
 * count limit per key, an age limit, and a byte budget for all keys together (past it, the oldest
 * entry of any key goes first, so one busy or abandoned topic cannot hold memory newer ones need).
 * Appends are stored at once, so none is ever lost; followers hear of them in a later microtask,
 * as a subscriber would, never inside `append`.
 */
const makeLog = (spec: JournalSpec): JournalLog => {
  const keys = new Map<string, Key>()
  /**
   * Every entry in sequence order across keys, for the budget and the age limit to find the oldest:
   * a queue read from `orderHead`. Its slots hold no entry, so one whose entry a key's count limit
   * dropped (`stale` of them) costs a slot, not the entry's bytes, until it is passed or compacted.
   */
  let order: Array<OrderSlot> = []
  let orderHead = 0
  let stale = 0
  let seq = 0
  /** What the budget counts: stored bytes plus ENTRY_OVERHEAD per entry. */
  let total = 0
  let stored = 0
  const maxAge = Duration.toMillis(Duration.decode(spec.maxAge))

  const keyOf = (name: string) => {
    let key = keys.get(name)
    if (key === undefined) {
      key = { name, entries: [], followers: new Set() }
      keys.set(name, key)
    }
    return key
  }
  /** A key with nothing stored and nobody following goes, so topics long gone cost nothing. */
  const release = (key: Key) => {
    if (key.entries.length === 0 && key.followers.size === 0 && keys.get(key.name) === key) keys.delete(key.name)
  }
  const dropFirst = (key: Key) => {
    const entry = key.entries.shift()
    if (entry === undefined) return
    total -= entry.data.byteLength + ENTRY_OVERHEAD
    stored--
    release(key)
  }
  const enforceLimits = (now: number) => {
    while (orderHead < order.length) {
      const { key, seq } = order[orderHead]!
      if (key.entries[0]?.seq !== seq) {
        orderHead++ // already dropped by its key's count limit
        stale--
        continue
      }
      const entry = key.entries[0]
      if (total <= spec.maxBytes && entry.at >= now - maxAge) break
      dropFirst(key)
      orderHead++
    }
    // The passed slots go once they are half the queue, and the stale ones once they outnumber what
    // is stored: each copy costs at most what was dropped since the last, so appends stay O(1).
    if (orderHead > 1024 && orderHead * 2 > order.length) {
      order = order.slice(orderHead)
      orderHead = 0
    }
    if (stale > stored + 1024) {
      order = order.slice(orderHead).filter(({ key, seq }) => key.entries.length > 0 && seq >= key.entries[0]!.seq)
      orderHead = 0
      stale = 0
    }
  }

  return {
    append: (name, data, options) => {
      const key = keyOf(name)
      const entry: JournalEntry = { seq: ++seq, data: ownBytes(data), at: Date.now(), traceparent: options?.traceparent }
      key.entries.push(entry)
      total += entry.data.byteLength + ENTRY_OVERHEAD
      stored++
      order.push({ key, seq: entry.seq })
      while (key.entries.length > spec.maxMessagesPerKey) {
        dropFirst(key)
        stale++
      }
      enforceLimits(entry.at)
      for (const follower of key.followers) queueMicrotask(() => follower(entry))
    },
    read: (name, { before, limit, maxBytes = Number.POSITIVE_INFINITY }) =>
      Effect.sync(() => {
        enforceLimits(Date.now())
        const entries = keys.get(name)?.entries ?? []
        // Back from the newest entry before the cursor, while the page has room.
        let end = entries.length
        while (end > 0 && before !== undefined && entries[end - 1]!.seq >= before) end--
        let start = end
        let bytes = 0
        while (start > 0 && end - start < limit) {
          const size = entries[start - 1]!.data.byteLength
          if (start < end && bytes + size > maxBytes) break
          bytes += size
          start--
        }
        return { entries: entries.slice(start, end), more: start > 0 }
      }),
    follow: (name, options, onEntry) =>
      Effect.acquireRelease(
        Effect.sync(() => {
          const key = keyOf(name)
          const from = options.from ?? seq + 1
          for (const entry of key.entries) if (entry.seq >= from) queueMicrotask(() => onEntry(entry))
          key.followers.add(onEntry)
          return key
        }),
        (key) =>
          Effect.sync(() => {
            key.followers.delete(onEntry)
            release(key)
          })
      ).pipe(Effect.asVoid),
    nextSeq: Effect.sync(() => seq + 1)
  }
}

export const makeJournal = (): JournalShape => {
  const logs = new Map<string, JournalLog>()
  return {
    open: (spec) =>
      Effect.sync(() => {
        const existing = logs.get(spec.name)
        if (existing) return existing
        const log = makeLog(spec)
        logs.set(spec.name, log)
        return log
      })
  }
}

/** The embedded bus, KV and journal, drained when the layer's scope closes. */
export const layer: Layer.Layer<Bus | Kv | Journal> = Layer.mergeAll(
  Layer.scoped(Bus, Effect.acquireRelease(Effect.sync(makeBus), (bus) => bus.drain)),
  Layer.sync(Kv, makeKv),
  Layer.sync(Journal, makeJournal)
)
