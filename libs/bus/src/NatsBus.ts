/**
 * The NATS adapter of the Bus and Kv ports (`@nats-io/*` v3, JetStream KV). The connection is a
 * scoped resource whose finalizer drains it. Every subject and bucket is put under a namespace so
 * that several deployments (or tests) can share one NATS without seeing each other.
 */
import {
  type ConsumerMessages,
  DeliverPolicy,
  DiscardPolicy,
  JetStreamApiCodes,
  JetStreamApiError,
  type JetStreamClient,
  type JetStreamManager,
  jetstream,
  jetstreamManager,
  type JsMsg,
  StorageType
} from "@nats-io/jetstream"
import { Kvm, KvWatchInclude, type KV, type KvEntry as NatsKvEntry } from "@nats-io/kv"
import {
  connect,
  headers as natsHeaders,
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
import * as Schedule from "effect/Schedule"
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
import { Journal, type JournalEntry, type JournalLog, type JournalShape, type JournalSpec } from "./Journal.ts"
import { appender } from "./JournalAppender.ts"
import { corker, FrozenHeaders, installPooledEncoder, rawHeaderBlock, watchConsumer } from "./internal/NatsShims.ts"
import { acquireReleaseSync } from "./ActorResource.ts"
import * as KvMetrics from "./KvMetrics.ts"
import { followByWatch, Kv, KvConflict, type KvBucketShape, type KvEntry, type KvShape } from "./Kv.ts"
import * as Subjects from "./Subjects.ts"

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
  /**
   * How long opening a bucket or journal waits for JetStream (not enabled yet on a server that
   * is starting, no meta leader during an election) before the start fails; 60 s by default.
   */
  readonly jetStreamWait?: Duration.DurationInput
  /** How long a KV write is tried again while JetStream is briefly unavailable; 10 s by default (an election takes up to 8 s). */
  readonly kvWriteRetry?: Duration.DurationInput
}

installPooledEncoder()

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
   * looked up in the raw block's text (`rawHeaderBlock`), or in nats.js's own parse without it.
   */
  header(name: string): string | undefined {
    if (this.head === undefined) {
      const head = rawHeaderBlock(this.msg)
      if (head === undefined) return nonEmpty(this.msg.headers?.get(name))
      this.head = head
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

/**
 * JetStream unavailable for now, not for good: no server answers its API (not enabled yet on a
 * server that is starting, nats.js says JetStreamNotEnabled) or a stream has no leader during an
 * election (503). Nothing was applied, so the operation may be tried again.
 */
export const isJetStreamUnavailable = (e: unknown): boolean =>
  // The class is not among the package's exports; its name is.
  (e instanceof Error && e.name === "JetStreamNotEnabled") ||
  (e instanceof JetStreamApiError && e.status === 503) ||
  (e instanceof BusError && isJetStreamUnavailable(e.cause))

/** Soon, then less often: a leader election takes seconds, a server starting a little longer. */
const jetStreamBackoff = Schedule.exponential("100 millis").pipe(Schedule.union(Schedule.spaced("2 seconds")))

/** Tries `effect` again, for up to `bound`, while `transient` says its failure is. */
const whileJetStreamUnavailable = (bound: Duration.DurationInput, transient: (e: unknown) => boolean = isJetStreamUnavailable) =>
<A, E>(effect: Effect.Effect<A, E>) => Effect.retry(effect, { while: transient, schedule: Schedule.upTo(jetStreamBackoff, bound) })

/**
 * Opening a bucket or journal creates it or opens the existing one, so a request that timed out
 * (sent just before the server restarted, say) can be sent again, which a write cannot.
 */
const isUnavailableOrTimedOut = (e: unknown): boolean =>
  isJetStreamUnavailable(e) || e instanceof TimeoutError || (e instanceof BusError && isUnavailableOrTimedOut(e.cause))

/**
 * Opening a bucket or journal at start waits for JetStream, with one warning that says so: a
 * service started with (or just before) its NATS, or during an election, would exit otherwise.
 */
const awaitingJetStream = (what: string, bound: Duration.DurationInput) => <A, E>(effect: Effect.Effect<A, E>) => {
  let warned = false
  return effect.pipe(
    Effect.tapError((e) => {
      if (warned || !isUnavailableOrTimedOut(e)) return Effect.void
      warned = true
      return Effect.logWarning(`JetStream is not available yet (${what}); trying again for up to ${Duration.format(bound)}`)
    }),
    whileJetStreamUnavailable(bound, isUnavailableOrTimedOut)
  )
}

const isConflict = (e: unknown) =>
  e instanceof JetStreamApiError &&
  (e.code === JetStreamApiCodes.StreamWrongLastSequence || e.code === JetStreamApiCodes.StreamWrongLastSequenceUnknown)

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

  // Not Effect.acquireRelease: one subscription per connection, whose release needs no fiber refs of its own.
  const subscribe: BusShape["subscribe"] = (subject, handler, options) =>
    acquireReleaseSync(
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
      (sub) => void (sub.isClosed() || sub.unsubscribe())
    ).pipe(Effect.map((sub) => ({
      drain: Effect.promise(() => (sub.isClosed() || nc.isClosed() ? Promise.resolve() : sub.drain().catch(() => undefined)))
    })))

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

  const flush = Effect.tryPromise({ try: () => nc.flush(), catch: busError("Publish", "flush failed") })

  const drain = Effect.promise(() => (nc.isClosed() ? Promise.resolve() : nc.drain().catch(() => undefined)))

  const reconnectListeners = new Set<() => void>()
  // A plain loop rather than a fiber: interrupting a fiber parked in the status iterator would wait
  // for its next event. It ends when the connection closes.
  void (async () => {
    for await (const s of nc.status()) {
      if (s.type === "reconnect") for (const listener of reconnectListeners) listener()
    }
  })().catch(() => undefined)
  const onReconnect = (listener: () => void) =>
    Effect.acquireRelease(Effect.sync(() => void reconnectListeners.add(listener)), () => Effect.sync(() => void reconnectListeners.delete(listener)))

  return {
    publish,
    unsafePublish,
    subscribe,
    stream,
    request,
    respond,
    flush,
    drain,
    shared: true,
    isConnected: () => !nc.isClosed() && !nc.isDraining(),
    onReconnect
  }
}

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

/**
 * nats.js's default, 30 s, let a topic's sequencer sit for two minutes after the NATS node that
 * held its consumer was killed (chaos suite): 30 s to miss two heartbeats, then a look for the
 * consumer every 30 s while JetStream still answered with timeouts. 10 s costs one idle pull per
 * followed topic every 10 s instead of 30 s.
 */
const FOLLOW_EXPIRES_MS = 10_000

/**
 * Follows one subject of a stream through an ordered consumer, from a sequence on, and makes a new
 * consumer when the one it has goes quiet. nats.js re-creates an ordered consumer itself after a
 * gap, or when the server says it is gone; but when the node that held it dies, it only asks after
 * it while JetStream answers with timeouts, and once this process's own connection was lost with
 * that node it stops watching the consumer's heartbeats until one of those asks succeeds: a topic's
 * sequencer then sat for up to 100 s after a NATS node was killed (chaos suite). A consumer that is
 * pulled from sends a heartbeat every half FOLLOW_EXPIRES when idle; one that has sent neither a
 * message nor a heartbeat for FOLLOW_STALE_MS is replaced, after the last sequence delivered, so
 * nothing is skipped or repeated.
 */
class Follower {
  private messages: ConsumerMessages | undefined
  private last = 0
  private seen = Date.now()
  private closed = false
  private restarting = false
  constructor(
    private readonly js: JetStreamClient,
    private readonly stream: string,
    private readonly subject: string,
    private readonly from: number,
    private readonly onMessage: (msg: JsMsg) => void
  ) {}

  async start() {
    const consumer = await this.js.consumers.get(this.stream, {
      filter_subjects: this.subject,
      deliver_policy: DeliverPolicy.StartSequence,
      opt_start_seq: Math.max(1, this.last > 0 ? this.last + 1 : this.from)
    })
    const messages = await consumer.consume({
      callback: (msg) => {
        this.seen = Date.now()
        this.last = msg.seq
        this.onMessage(msg)
      },
      expires: FOLLOW_EXPIRES_MS
    })
    if (this.closed) return void (await messages.close().catch(() => undefined))
    this.messages = messages
    this.seen = Date.now()
    followers.add(this)
    sweeping ??= setInterval(sweep, 3_000).unref()
    void (async () => {
      for await (const status of messages.status()) if (status.type === "heartbeat") this.seen = Date.now()
    })().catch(() => undefined)
  }

  /** Called by the sweep: a consumer quiet for too long is replaced. */
  check(now: number) {
    if (!this.restarting && !this.closed && now - this.seen > FOLLOW_STALE_MS) void this.restart()
  }

  /** A new consumer after the last sequence delivered, tried again each second until one is made. */
  private async restart() {
    this.restarting = true
    const old = this.messages
    this.messages = undefined
    await old?.close().catch(() => undefined)
    while (!this.closed) {
      try {
        await this.start()
        break
      } catch {
        await new Promise((resolve) => setTimeout(resolve, 1_000))
      }
    }
    this.restarting = false
  }

  async close() {
    this.closed = true
    followers.delete(this)
    await this.messages?.close().catch(() => undefined)
  }
}

/** A followed key's consumer that sent nothing, not even a heartbeat, this long is replaced. */
const FOLLOW_STALE_MS = 12_000

/** Every follower of the process, looked at by one timer rather than one each (there is one per followed topic). */
const followers = new Set<Follower>()
let sweeping: ReturnType<typeof setInterval> | undefined
const sweep = () => {
  const now = Date.now()
  for (const f of followers) f.check(now)
}

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
 * One JetStream manager per connection, made when first needed and shared by KV and journals. One
 * that could not be made (JetStream not enabled yet) is made again next time, not kept failed.
 */
const lazyManager = (nc: NatsConnection) => {
  let manager: Promise<JetStreamManager> | undefined
  return () =>
    (manager ??= jetstreamManager(nc).catch((e: unknown) => {
      manager = undefined
      throw e
    }))
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
  nc: NatsConnection,
  namespace: string,
  jsm: () => Promise<JetStreamManager>,
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

export const DEFAULT_JETSTREAM_WAIT = "60 seconds"
export const DEFAULT_KV_WRITE_RETRY = "10 seconds"

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
 * A journal is one JetStream stream with a subject per key: per-key count (`max_msgs_per_subject`),
 * age and a total byte limit, oldest dropped first. Appends are acknowledged publishes (see
 * JournalAppender). A key is read and followed through ordered consumers filtered on its subject:
 * an ephemeral, unreplicated consumer costs the server far less than a stream (a raft group in a
 * cluster) per key did.
 */
export const makeJournal = (
  nc: NatsConnection,
  namespace: string,
  jsm: () => Promise<JetStreamManager>,
  replicas = 1,
  lost: (journal: string, count: number, why: string) => void = () => {},
  observer?: Instruments.JournalObserver,
  jetStreamWait: Duration.DurationInput = DEFAULT_JETSTREAM_WAIT
): JournalShape => {
  const js = jetstream(nc)
  const log = (m: JetStreamManager, spec: JournalSpec): JournalLog => {
    const name = `${namespace}_${spec.name}`
    const subjectOf = (key: string) => `${namespace}.${Subjects.journalSubject(spec.name, key)}`
    const keyOf = (subject: string) => subject.slice(subjectOf("").length)
    const append = appender(js, {
      retryAfterMillis: 250,
      giveUpAfterMillis: Duration.toMillis(Duration.decode(spec.retryFor)),
      maxPending: 10_000,
      timeoutMillis: 5_000,
      lost: (count, why) => lost(spec.name, count, why),
      ...(observer === undefined ? {} : { stored: (subject: string, seconds: number) => observer.stored(keyOf(subject), seconds), failed: observer.failed })
    })
    const toEntry = (msg: JsMsg): JournalEntry => ({
      seq: msg.seq,
      data: msg.data,
      at: Math.floor(Number(msg.info.timestampNanos) / 1_000_000),
      traceparent: msg.headers?.get(Subjects.Header.traceparent) || undefined
    })
    const nextSeq = async () => (await m.streams.info(name)).state.last_seq + 1
    return {
      append: (key, data, options) => {
        let headers: MsgHdrs | undefined
        if (options?.traceparent !== undefined) {
          headers = natsHeaders()
          headers.set(Subjects.Header.traceparent, options.traceparent)
        }
        if (observer === undefined) return append(subjectOf(key), data, options?.lost, headers)
        // The key's lag lasts until its entry is stored or given up.
        observer.appended(key)
        append(subjectOf(key), data, (why) => {
          observer.lost(key, 1)
          options?.lost?.(why)
        }, headers)
      },
      read: (key, { before, limit, maxBytes = Number.POSITIVE_INFINITY }) =>
        Effect.tryPromise({
          try: async () => {
            const subject = subjectOf(key)
            const { state } = await m.streams.info(name, { subjects_filter: subject })
            const stored = state.subjects?.[subject] ?? 0
            if (stored === 0) return { entries: [], more: false }
            // A key holds at most `maxMessagesPerKey` entries, so reading it from its start is
            // bounded; JetStream has no backwards read by subject.
            const consumer = await js.consumers.get(name, { filter_subjects: subject, deliver_policy: DeliverPolicy.All })
            const messages = await consumer.fetch({ max_messages: stored, expires: 5_000 })
            // A window over the key that keeps only its newest entries within the limits, so a read
            // holds about one page whatever the key holds.
            const out: Array<JournalEntry> = []
            let bytes = 0
            let more = false
            try {
              for await (const msg of messages) {
                if (before !== undefined && msg.seq >= before) break
                out.push(toEntry(msg))
                bytes += msg.data.byteLength
                while (out.length > limit || (out.length > 1 && bytes > maxBytes)) {
                  bytes -= out.shift()!.data.byteLength
                  more = true
                }
                if (msg.info.pending === 0) break
              }
            } finally {
              await messages.close()
            }
            return { entries: out, more }
          },
          catch: busError("Kv", `read ${key} from journal ${spec.name}`)
        }),
      follow: (key, options, onEntry) =>
        Effect.acquireRelease(
          Effect.tryPromise({
            try: async () => {
              const follower = new Follower(js, name, subjectOf(key), options.from ?? (await nextSeq()), (msg) => onEntry(toEntry(msg)))
              await follower.start()
              return follower
            },
            catch: busError("Kv", `follow ${key} in journal ${spec.name}`)
          }),
          (follower) => Effect.promise(() => follower.close())
        ).pipe(Effect.asVoid),
      nextSeq: Effect.tryPromise({ try: nextSeq, catch: busError("Kv", `journal ${spec.name}`) })
    }
  }
  return {
    open: (spec) =>
      Effect.tryPromise({
        try: async () => {
          const name = `${namespace}_${spec.name}`
          const m = await jsm()
          const maxAge = Duration.toMillis(Duration.decode(spec.maxAge))
          const config = {
            name,
            subjects: [`${namespace}.${Subjects.journalSubject(spec.name, "*")}`],
            max_msgs_per_subject: spec.maxMessagesPerKey,
            max_bytes: spec.maxBytes,
            max_age: nanos(maxAge),
            // Retried appends are recognised by their id for this long; it may not exceed max_age.
            duplicate_window: nanos(Math.min(maxAge, 2 * 60_000)),
            storage: StorageType.File,
            discard: DiscardPolicy.Old,
            num_replicas: replicas
          }
          await m.streams.add(config).catch(async (e: unknown) => {
            if (!(e instanceof Error && /already in use/i.test(e.message))) throw e
            const { config: existing } = await m.streams.info(name)
            return m.streams.update(name, { ...existing, ...config, num_replicas: Math.max(existing.num_replicas, replicas) })
          })
          return log(m, spec)
        },
        catch: busError("Kv", `open journal ${spec.name}`)
      }).pipe(awaitingJetStream(`opening journal ${spec.name}`, jetStreamWait))
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
        Context.add(
          Kv,
          KvMetrics.metered(
            makeKv(nc, namespace, jsm, options.replicas, {
              ...(options.jetStreamWait === undefined ? {} : { jetStream: options.jetStreamWait }),
              ...(options.kvWriteRetry === undefined ? {} : { writes: options.kvWriteRetry })
            }),
            metrics
          )
        ),
        Context.add(
          Journal,
          makeJournal(
            nc,
            namespace,
            jsm,
            options.replicas,
            (journal, count, why) => Runtime.runFork(runtime)(Effect.logError(`journal ${journal}: ${count} append(s) lost: ${why}`)),
            Instruments.journal(metrics),
            options.jetStreamWait
          )
        )
      )
    })
  )
