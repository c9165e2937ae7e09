/**
 * The journal port: one append-only log (a single JetStream stream on NATS) holding many keys, each
 * with its own bounded retention, read back newest-last and followed as it grows. MCPx keeps every
 * topic's history in one, a key per topic: a stream per topic would be a raft group per topic.
 */
import * as Context from "effect/Context"
import type * as Duration from "effect/Duration"
import type * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import type { BusError } from "./Bus.ts"

export interface JournalSpec {
  /** `[A-Za-z0-9_-]` only; the adapter namespaces it. */
  readonly name: string
  /** Per key: its oldest entries are dropped beyond this many (JetStream's `max_msgs_per_subject`). */
  readonly maxMessagesPerKey: number
  /** Entries older than this are dropped. */
  readonly maxAge: Duration.DurationInput
  /**
   * What all keys together may hold; the oldest entries of any key are dropped beyond it. Each
   * entry counts its bytes and what the adapter spends on it besides (JetStream: its subject and
   * headers; the embedded journal: its objects). JetStream has no byte limit per subject, so a key's own bytes are bounded only by `maxMessagesPerKey`
   * times the largest entry the caller accepts.
   */
  readonly maxBytes: number
  /**
   * How long an append that cannot be stored is retried before it is given up and its `lost`
   * callback told why.
   */
  readonly retryFor: Duration.DurationInput
}

export interface JournalEntry {
  /** The journal's sequence: increasing across all keys, so a key's entries have gaps. */
  readonly seq: number
  readonly data: Uint8Array
  /** Epoch milliseconds when it was stored. */
  readonly at: number
  /** The W3C trace context the appender gave, so a follower's span continues the trace. */
  readonly traceparent?: string | undefined
}

export interface AppendOptions {
  /** Told why, once, if the entry is given up unstored (NATS only: the embedded journal stores at once). */
  readonly lost?: (why: string) => void
  readonly traceparent?: string | undefined
}

export interface ReadOptions {
  /** At most this many entries: the newest ones before `before`. */
  readonly limit: number
  /** Only entries with a sequence below this (a cursor from an earlier read). */
  readonly before?: number
  /**
   * At most this many bytes of entries' data, counted from the newest; the newest entry comes even
   * when it alone is larger, so reading page by page always makes progress. Unset: no byte bound.
   */
  readonly maxBytes?: number
}

/** What one read found: a key's entries, oldest first, and whether older ones remain. */
export interface JournalPage {
  readonly entries: ReadonlyArray<JournalEntry>
  /** Entries older than the first returned (and before the cursor) remain: read on with its `seq` as `before`. */
  readonly more: boolean
}

export interface FollowOptions {
  /** The first sequence to deliver; unset: only entries appended after `follow` returns. */
  readonly from?: number
}

export interface JournalLog {
  /**
   * Appends without waiting; appends from one caller keep their order (except across a failure,
   * when a retried entry lands after later ones). An append that is still not stored after the
   * spec's `retryFor` is dropped and reported to `options.lost`.
   */
  readonly append: (key: string, data: Uint8Array | string, options?: AppendOptions) => void
  /** The newest entries before the cursor that fit the read's limits, oldest first. */
  readonly read: (key: string, options: ReadOptions) => Effect.Effect<JournalPage, BusError>
  /**
   * Calls `onEntry` with every entry of `key` from `options.from` on, in sequence order, as they are
   * stored, until the scope closes. It returns once following has begun.
   */
  readonly follow: (
    key: string,
    options: FollowOptions,
    onEntry: (entry: JournalEntry) => void
  ) => Effect.Effect<void, BusError, Scope.Scope>
  /** The sequence the next entry of any key will get at least (for a follower's `from`). */
  readonly nextSeq: Effect.Effect<number, BusError>
}

export interface JournalShape {
  /** Opens a journal, creating it when missing, or updating its limits to the spec's. */
  readonly open: (spec: JournalSpec) => Effect.Effect<JournalLog, BusError>
}

export class Journal extends Context.Tag("@switchboard/bus/Journal")<Journal, JournalShape>() {}
