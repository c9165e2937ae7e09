/**
 * The NATS adapter of the Journal port. A journal is one JetStream stream with a subject per key:
 * per-key count (`max_msgs_per_subject`), age and a total byte limit, oldest dropped first. Appends
 * are acknowledged publishes (see JournalAppender). A key is read and followed through ordered
 * consumers filtered on its subject: an ephemeral, unreplicated consumer costs the server far less
 * than a stream (a raft group in a cluster) per key did.
 */
import {
  type ConsumerMessages,
  DeliverPolicy,
  DiscardPolicy,
  type JetStreamClient,
  type JetStreamManager,
  jetstream,
  type JsMsg,
  StorageType
} from "@nats-io/jetstream"
import { headers as natsHeaders, type MsgHdrs, nanos } from "@nats-io/transport-node"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type * as Instruments from "@switchboard/telemetry/Instruments"
import type { FollowerSweep, Swept } from "./FollowerSweep.ts"
import type { JournalEntry, JournalLog, JournalShape, JournalSpec } from "./Journal.ts"
import { appender } from "./JournalAppender.ts"
import type { NatsLink } from "./NatsConnection.ts"
import { awaitingJetStream, busError, DEFAULT_JETSTREAM_WAIT } from "./NatsFailures.ts"
import * as Subjects from "./Subjects.ts"

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
class Follower implements Swept {
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
    private readonly onMessage: (msg: JsMsg) => void,
    private readonly sweep: FollowerSweep
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
    this.sweep.add(this)
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
    this.sweep.remove(this)
    await this.messages?.close().catch(() => undefined)
  }
}

/** A followed key's consumer that sent nothing, not even a heartbeat, this long is replaced. */
const FOLLOW_STALE_MS = 12_000

export const makeJournal = (
  { jsm, namespace, nc }: NatsLink,
  sweep: FollowerSweep,
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
              const follower = new Follower(js, name, subjectOf(key), options.from ?? (await nextSeq()), (msg) => onEntry(toEntry(msg)), sweep)
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
