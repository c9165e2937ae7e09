/**
 * The NATS adapter of the Bus and Kv ports (`@nats-io/*` v3, JetStream KV). The connection is a
 * scoped resource whose finalizer drains it. Every subject and bucket is put under a namespace so
 * that several deployments (or tests) can share one NATS without seeing each other.
 */
import {
  DiscardPolicy,
  JetStreamApiCodes,
  JetStreamApiError,
  type JetStreamManager,
  jetstream,
  jetstreamManager,
  StorageType
} from "@nats-io/jetstream"
import { Kvm, KvWatchInclude, type KV, type KvEntry as NatsKvEntry } from "@nats-io/kv"
import { TE } from "@nats-io/nats-core/internal"
import {
  connect,
  MsgHdrsImpl,
  type Msg,
  type MsgHdrs,
  nanos,
  type NatsConnection,
  type PublishOptions,
  RequestError,
  TimeoutError
} from "@nats-io/transport-node"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Runtime from "effect/Runtime"
import * as Stream from "effect/Stream"
import * as Instruments from "@switchboard/telemetry/Instruments"
import { Metrics } from "@switchboard/telemetry/Metrics"
import {
  Bus,
  BusError,
  type BusMessage,
  type BusShape,
  DEFAULT_REQUEST_TIMEOUT,
  type Headers,
  NoResponders,
  RequestTimeout,
  toBytes
} from "./Bus.ts"
import { Journal, type JournalEntry, type JournalHandle, type JournalShape } from "./Journal.ts"
import { appender } from "./JournalAppender.ts"
import * as KvMetrics from "./KvMetrics.ts"
import { Kv, KvConflict, type KvBucketShape, type KvEntry, type KvShape } from "./Kv.ts"
import { Socket } from "node:net"

export interface NatsOptions {
  /** One or more server URLs. */
  readonly servers: ReadonlyArray<string>
  /** Subject and bucket namespace; `sb` by default. */
  readonly namespace?: string
  /** Client name shown by the server's monitoring. */
  readonly name?: string
  /**
   * Replicas of every KV bucket and journal stream: 1 on a single server, 3 on a three-node
   * cluster so that losing a node loses no state. An existing one with fewer is scaled up.
   */
  readonly replicas?: number
}

/**
 * nats.js encodes every protocol line it writes (`HPUB <subject> ...`) with one shared TextEncoder,
 * whose encode() makes a new ArrayBuffer per call; Buffer.from takes short strings from Node's pool,
 * about 4× faster on Node 20. Same bytes, and a Buffer is a Uint8Array. (Internal API, like the
 * socket below; on a nats.js without it this does nothing.)
 */
if (TE instanceof TextEncoder) TE.encode = (input = "") => Buffer.from(input)

/** Headers that never change once built, so their wire form is encoded once, not per publish. */
class FrozenHeaders extends MsgHdrsImpl {
  private encoded: Uint8Array | undefined
  override encode(): Uint8Array {
    // A copy of its own, since it is kept as long as the connection: a slice of Node's pool would
    // keep the whole 8 KiB slab alive.
    return (this.encoded ??= new Uint8Array(super.encode()))
  }
}

/**
 * Hot publishers (the edge, actors) reuse one header record per connection or kind, so the
 * converted headers are cached per record rather than rebuilt and re-encoded for every message.
 */
const converted = new WeakMap<Headers, MsgHdrs>()
const toNatsHeaders = (h: Headers | undefined): MsgHdrs | undefined => {
  if (h === undefined) return undefined
  const cached = converted.get(h)
  if (cached !== undefined) return cached
  let out: FrozenHeaders | undefined
  for (const k in h) {
    out ??= new FrozenHeaders()
    out.set(k, h[k]!)
  }
  if (out !== undefined) converted.set(h, out)
  return out
}

/** What nats.js keeps of a received message before it parses anything (internal API). */
interface RawMsg {
  readonly _rdata?: Uint8Array
  readonly _msg?: { readonly hdr?: number }
}

const headerDecoder = new TextDecoder()

class NatsMessage implements BusMessage {
  /** The header block as text (`NATS/1.0\r\nname: value\r\n...`), "" when there is none. */
  private head: string | undefined
  constructor(
    private readonly msg: Msg,
    readonly subject: string
  ) {}
  get data() {
    return this.msg.data
  }
  get reply() {
    return this.msg.reply || undefined
  }
  /**
   * An empty header value reads as absent: one lookup instead of `has` then `get`. Headers are
   * looked up in the block's text: nats.js's own parse builds a Map of arrays per message, and the
   * hot paths read two or three headers of each. Falls back to it if nats.js changes shape.
   */
  header(name: string): string | undefined {
    if (this.head === undefined) {
      const raw = this.msg as unknown as RawMsg
      const end = raw._msg?.hdr
      if (raw._rdata === undefined || end === undefined) return nonEmpty(this.msg.headers?.get(name))
      this.head = end > 0 ? headerDecoder.decode(raw._rdata.subarray(0, end)) : ""
    }
    // Names are ours, written as `name: value`; values never hold a line break.
    const at = this.head.indexOf(`\r\n${name}:`)
    if (at < 0) return undefined
    const from = at + name.length + 3
    return nonEmpty(this.head.slice(from, this.head.indexOf("\r\n", from)).trim())
  }
}

const nonEmpty = (value: string | undefined) => (value === undefined || value === "" ? undefined : value)

const busError = (reason: BusError["reason"], message: string) => (cause: unknown) =>
  new BusError({ reason, message: `${message}: ${cause instanceof Error ? cause.message : String(cause)}`, cause })

const isConflict = (e: unknown) =>
  e instanceof JetStreamApiError &&
  (e.code === JetStreamApiCodes.StreamWrongLastSequence || e.code === JetStreamApiCodes.StreamWrongLastSequenceUnknown)

/**
 * nats.js writes what one microtask published with one socket write. A busy edge handles one
 * socket read per task, so it made one write (a syscall) per frame. Corking the connection's socket
 * gathers the writes into one writev. The cork lasts the turn of the event loop that wrote and the
 * next one: a busy process reads more frames in that turn, and their writes join the same flush;
 * an idle one goes through it at once (pending immediates make the poll not wait). In two paired
 * bench runs of the distributed proxy at 50×10, the CPU per message of the edges, the router,
 * nats-server (fewer, larger reads) and the bench together fell by 5% and 9%, for about 1% more
 * latency at 1×1. Nothing is reordered: every write of the connection goes through the socket.
 * The socket is nats.js's own (not public API); without it, writes go out as before.
 */
const corker = (nc: NatsConnection) => {
  let corked = false
  let turns = 0
  const uncork = (socket: Socket) => {
    if (++turns < 2) return void setImmediate(uncork, socket)
    corked = false
    socket.uncork()
  }
  return () => {
    if (corked) return
    const socket = (nc as unknown as { readonly protocol?: { readonly transport?: { readonly socket?: unknown } } }).protocol?.transport?.socket
    if (!(socket instanceof Socket) || socket.destroyed) return
    corked = true
    turns = 0
    socket.cork()
    setImmediate(uncork, socket)
  }
}

export const makeBus = (nc: NatsConnection, namespace: string): BusShape => {
  const prefix = `${namespace}.`
  const strip = (subject: string) => (subject.startsWith(prefix) ? subject.slice(prefix.length) : subject)
  const cork = corker(nc)

  const unsafePublish = (subject: string, data: Uint8Array | string, headers?: Headers, reply?: string) => {
    const h = toNatsHeaders(headers)
    let opts: PublishOptions | undefined
    if (h !== undefined || reply !== undefined) {
      opts = {}
      if (h !== undefined) opts.headers = h
      if (reply !== undefined) opts.reply = reply
    }
    try {
      cork()
      nc.publish(prefix + subject, toBytes(data), opts)
    } catch (cause) {
      throw busError("Publish", `publish to ${subject} failed`)(cause)
    }
  }

  const publish: BusShape["publish"] = (subject, data, headers) =>
    Effect.try({ try: () => unsafePublish(subject, data, headers), catch: (e) => (e instanceof BusError ? e : busError("Publish", subject)(e)) })

  const subscribe: BusShape["subscribe"] = (subject, handler, options) =>
    Effect.acquireRelease(
      Effect.try({
        try: () =>
          nc.subscribe(prefix + subject, {
            ...(options?.queue === undefined ? {} : { queue: options.queue }),
            callback: (err, msg) => {
              if (err) return
              handler(new NatsMessage(msg, strip(msg.subject)))
            }
          }),
        catch: busError("Subscribe", `subscribe to ${subject} failed`)
      }),
      (sub) => Effect.sync(() => sub.unsubscribe())
    ).pipe(Effect.asVoid)

  const stream: BusShape["stream"] = (subject, options) =>
    Stream.asyncScoped<BusMessage, BusError>((emit) => subscribe(subject, (m) => void emit.single(m), options))

  const request: BusShape["request"] = (subject, data, options) => {
    const timeout = Duration.decode(options?.timeout ?? DEFAULT_REQUEST_TIMEOUT)
    const h = toNatsHeaders(options?.headers)
    return Effect.tryPromise({
      try: () =>
        nc.request(prefix + subject, data, { timeout: Duration.toMillis(timeout), ...(h === undefined ? {} : { headers: h }) }),
      catch: (e): NoResponders | RequestTimeout | BusError => {
        if (e instanceof RequestError && e.isNoResponders()) return new NoResponders({ subject })
        if (e instanceof TimeoutError || (e instanceof RequestError && e.cause instanceof TimeoutError)) {
          return new RequestTimeout({ subject, timeout })
        }
        return busError("Publish", `request to ${subject} failed`)(e)
      }
    }).pipe(Effect.map((msg): BusMessage => new NatsMessage(msg, subject)))
  }

  const respond: BusShape["respond"] = (message, data, headers) => {
    const reply = message.reply
    if (reply === undefined) return Effect.void
    const h = toNatsHeaders(headers)
    return Effect.try({
      try: () => nc.publish(reply, data, h === undefined ? undefined : { headers: h }),
      catch: busError("Publish", "respond failed")
    })
  }

  const drain = Effect.promise(() => (nc.isClosed() ? Promise.resolve() : nc.drain().catch(() => undefined)))

  return { publish, unsafePublish, subscribe, stream, request, respond, drain, isConnected: () => !nc.isClosed() && !nc.isDraining() }
}

const toEntry = (e: NatsKvEntry): KvEntry => ({
  key: e.key,
  value: e.value,
  revision: e.revision,
  operation: e.operation === "PUT" ? "PUT" : "DEL"
})

const KEYS_BOUND = "250 millis"

/** `full` is the bucket's namespaced name, whose stream is `KV_<full>`. */
const makeBucket = (name: string, full: string, kv: KV, jsm: () => Promise<JetStreamManager>): KvBucketShape => {
  const kvError = (what: string) => busError("Kv", `${what} on bucket ${name}`)
  const streamName = `KV_${full}`
  const lastSeq = async () => (await (await jsm()).streams.info(streamName)).state.last_seq
  /** The keys among the stream's subjects that `known` lacks and that are live (a get each). */
  const liveFromSubjects = async (filter: string, known: ReadonlySet<string>) => {
    const prefix = `$KV.${full}.`
    const info = await (await jsm()).streams.info(streamName, { subjects_filter: prefix + filter })
    const keys = await Promise.all(
      Object.keys(info.state.subjects ?? {}).map(async (subject) => {
        const key = subject.slice(prefix.length)
        if (known.has(key)) return undefined
        const e = await kv.get(key)
        return e !== null && e.operation === "PUT" ? key : undefined
      })
    )
    return keys.filter((k) => k !== undefined)
  }
  const claim = (what: string, key: string, reason: KvConflict["reason"], op: () => Promise<number>) =>
    Effect.tryPromise({
      try: op,
      catch: (e): KvConflict | BusError => (isConflict(e) ? new KvConflict({ key, reason }) : kvError(`${what} ${key}`)(e))
    })
  return {
    name,
    get: (key) =>
      Effect.tryPromise({ try: () => kv.get(key), catch: kvError(`get ${key}`) }).pipe(
        Effect.map((e) => (e !== null && e.operation === "PUT" ? Option.some(toEntry(e)) : Option.none()))
      ),
    put: (key, value) => Effect.tryPromise({ try: () => kv.put(key, value), catch: kvError(`put ${key}`) }),
    create: (key, value) => claim("create", key, "Exists", () => kv.create(key, value)),
    update: (key, value, revision) => claim("update", key, "WrongRevision", () => kv.update(key, value, revision)),
    delete: (key) => Effect.tryPromise({ try: () => kv.delete(key), catch: kvError(`delete ${key}`) }),
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
          )
        )
      )
  }
}

/** One JetStream manager per connection, made when first needed and shared by KV and journals. */
const lazyManager = (nc: NatsConnection) => {
  let manager: Promise<JetStreamManager> | undefined
  return () => (manager ??= jetstreamManager(nc))
}

/**
 * Scales an existing stream up to `replicas`, never down: a stream an operator raised by hand, or
 * one a newer replica of this service already raised during a rolling upgrade, keeps its copies.
 */
const atLeastReplicas = async (m: JetStreamManager, stream: string, replicas: number) => {
  const { config } = await m.streams.info(stream)
  if (config.num_replicas < replicas) await m.streams.update(stream, { ...config, num_replicas: replicas })
}

export const makeKv = (nc: NatsConnection, namespace: string, jsm: () => Promise<JetStreamManager>, replicas = 1): KvShape => {
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
          return makeBucket(spec.name, full, kv, jsm)
        },
        catch: busError("Kv", `open bucket ${spec.name}`)
      })
  }
}

export const connection = (options: NatsOptions) =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () =>
        connect({
          servers: [...options.servers],
          name: options.name ?? "switchboard",
          maxReconnectAttempts: -1,
          reconnectTimeWait: 250,
          pingInterval: 10_000
        }),
      catch: busError("Connect", `cannot connect to NATS at ${options.servers.join(",")}`)
    }),
    (nc) => Effect.promise(() => (nc.isClosed() ? Promise.resolve() : nc.drain().catch(() => undefined)))
  )

/**
 * Journals are JetStream streams with message-count, byte and age limits, oldest dropped first.
 * A total across streams (`JournalSpec.totalBytes`) is not kept here: the streams live in the
 * NATS server, whose account limits (`max_file`/`max_mem` in the account's JetStream settings)
 * bound what all of them hold together.
 */
export const makeJournal = (
  nc: NatsConnection,
  namespace: string,
  jsm: () => Promise<JetStreamManager>,
  replicas = 1,
  lost: (journal: string, count: number, why: string) => void = () => {},
  observer?: Instruments.JournalObserver
): JournalShape => {
  const js = jetstream(nc)
  const handle = (m: JetStreamManager, journal: string): JournalHandle => {
    const name = `${namespace}_${journal}`
    const subject = `${namespace}.journal.${journal}`
    const append = appender(js, subject, {
      retryAfterMillis: 250,
      giveUpAfterMillis: 30_000,
      maxPending: 10_000,
      timeoutMillis: 5_000,
      lost: (count, why) => {
        observer?.lost(journal, count)
        lost(journal, count, why)
      },
      ...(observer === undefined ? {} : { stored: (seconds: number) => observer.stored(journal, seconds), failed: observer.failed })
    })
    return {
      append: observer === undefined ? append : (data) => {
        observer.appended(journal)
        append(data)
      },
      read: ({ before, limit }) =>
        Effect.tryPromise({
          try: async () => {
            const { state } = await m.streams.info(name)
            const last = before === undefined ? state.last_seq : Math.min(before - 1, state.last_seq)
            const first = Math.max(state.first_seq, last - limit + 1)
            const out: Array<JournalEntry> = []
            for (let seq = first; seq <= last && seq > 0; seq++) {
              const msg = await m.streams.getMessage(name, { seq }).catch(() => null)
              if (msg !== null) out.push({ seq: msg.seq, data: msg.data, at: msg.time.getTime() })
            }
            return out
          },
          catch: busError("Kv", `read journal ${journal}`)
        })
    }
  }
  return {
    open: (spec) =>
      Effect.tryPromise({
        try: async () => {
          const name = `${namespace}_${spec.name}`
          const m = await jsm()
          const config = {
            name,
            subjects: [`${namespace}.journal.${spec.name}`],
            max_msgs: spec.maxMessages,
            max_bytes: spec.maxBytes,
            max_age: nanos(Duration.toMillis(Duration.decode(spec.maxAge))),
            storage: StorageType.File,
            discard: DiscardPolicy.Old,
            num_replicas: replicas
          }
          await m.streams.add(config).catch(async (e: unknown) => {
            if (!(e instanceof Error && /already in use/i.test(e.message))) throw e
            const { config: existing } = await m.streams.info(name)
            return m.streams.update(name, { ...config, num_replicas: Math.max(existing.num_replicas, replicas) })
          })
          return handle(m, spec.name)
        },
        catch: busError("Kv", `open journal ${spec.name}`)
      }),
    find: (journal) =>
      Effect.tryPromise({
        try: async () => {
          const m = await jsm()
          const found = await m.streams.info(`${namespace}_${journal}`).then(
            () => true,
            (e: unknown) => {
              if (e instanceof JetStreamApiError && e.code === JetStreamApiCodes.StreamNotFound) return false
              throw e
            }
          )
          return found ? Option.some(handle(m, journal)) : Option.none()
        },
        catch: busError("Kv", `find journal ${journal}`)
      })
  }
}

/** Bus, Kv and Journal over one NATS connection, drained when the layer's scope closes. */
export const layer = (options: NatsOptions): Layer.Layer<Bus | Kv | Journal, BusError> =>
  Layer.scopedContext(
    Effect.gen(function*() {
      const nc = yield* connection(options)
      const namespace = options.namespace ?? "sb"
      yield* Stream.fromAsyncIterable(nc.status(), () => undefined).pipe(
        Stream.filter((s) => s.type === "disconnect" || s.type === "reconnect" || s.type === "error"),
        Stream.runForEach((s) => Effect.logWarning(`NATS ${s.type}`)),
        Effect.ignore,
        // Interrupting a fiber parked in the status iterator waits for its next event (up to a ping
        // interval), so this one is left to end by itself when the connection closes.
        Effect.forkDaemon
      )
      yield* Effect.logInfo(`connected to NATS at ${nc.getServer()} (namespace ${namespace})`)
      const jsm = lazyManager(nc)
      const runtime = yield* Effect.runtime<never>()
      const metrics = yield* Metrics
      return Context.make(Bus, makeBus(nc, namespace)).pipe(
        Context.add(Kv, KvMetrics.metered(makeKv(nc, namespace, jsm, options.replicas), metrics)),
        Context.add(
          Journal,
          makeJournal(nc, namespace, jsm, options.replicas, (journal, count, why) =>
            Runtime.runFork(runtime)(Effect.logError(`journal ${journal}: ${count} append(s) lost: ${why}`)), Instruments.journal(metrics))
        )
      )
    })
  )
