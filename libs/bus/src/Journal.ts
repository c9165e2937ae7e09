/**
 * The journal port: an append-only log per name with bounded retention (a JetStream stream on
 * NATS), read back newest-last. MCPx keeps each topic's history in one.
 */
import * as Context from "effect/Context"
import type * as Duration from "effect/Duration"
import type * as Effect from "effect/Effect"
import type * as Option from "effect/Option"
import type { BusError } from "./Bus.ts"

export interface JournalSpec {
  /** `[A-Za-z0-9_-]` only; the adapter namespaces it. */
  readonly name: string
  /** Oldest entries are dropped beyond this many. */
  readonly maxMessages: number
  /** Entries older than this are dropped. */
  readonly maxAge: Duration.DurationInput
  /** Oldest entries are dropped while the journal holds more bytes than this. */
  readonly maxBytes: number
  /**
   * What all journals of an adapter that keeps them in its own memory (the embedded one) may hold
   * together; the oldest entries of any journal are dropped beyond it, and the smallest budget any
   * opener gave applies. JetStream ignores it: a total across streams is the account's limits.
   */
  readonly totalBytes?: number
}

export interface JournalEntry {
  readonly seq: number
  readonly data: Uint8Array
  /** Epoch milliseconds when it was stored. */
  readonly at: number
}

export interface ReadOptions {
  /** At most this many entries: the newest ones before `before`. */
  readonly limit: number
  /** Only entries with a sequence below this (a cursor from an earlier read). */
  readonly before?: number
}

export interface JournalHandle {
  /** Appends without waiting; appends from one caller keep their order. */
  readonly append: (data: Uint8Array | string) => void
  /** Oldest first. */
  readonly read: (options: ReadOptions) => Effect.Effect<ReadonlyArray<JournalEntry>, BusError>
}

export interface JournalShape {
  /** Opens a journal, creating it when missing. */
  readonly open: (spec: JournalSpec) => Effect.Effect<JournalHandle, BusError>
  /**
   * Opens a journal only if it exists: a reader must not create one per name it is asked about
   * (a stream each, on NATS).
   */
  readonly find: (name: string) => Effect.Effect<Option.Option<JournalHandle>, BusError>
}

export class Journal extends Context.Tag("@switchboard/bus/Journal")<Journal, JournalShape>() {}
