/**
 * Journal appends that are acknowledged, and retried until they are. A core publish to a stream's
 * subject is stored without an answer, so one sent while the stream has no leader (an election
 * after a node died, a stream just scaled up) was lost without a word.
 *
 * Each append is published to JetStream at once (pipelined, in order) with a message id, and
 * kept until its acknowledgement. A failure pauses, then sends every entry still unacknowledged
 * again, oldest first; the id lets the stream drop a copy it already has (within its duplicate
 * window, 2 minutes by default). What is still unacknowledged after `giveUpAfter`, or beyond
 * `maxPending` entries, is reported to `lost` and dropped: bounded memory while NATS is away.
 * An entry retried after a later one was stored lands after it: order holds except across a failure.
 */
import type { JetStreamClient } from "@nats-io/jetstream"
import type { MsgHdrs } from "@nats-io/transport-node"
import { randomBytes } from "node:crypto"

export interface AppenderOptions {
  readonly retryAfterMillis: number
  readonly giveUpAfterMillis: number
  readonly maxPending: number
  readonly timeoutMillis: number
  /** Entries dropped unstored, and why: for a log line. */
  readonly lost: (count: number, why: string) => void
  /** For metrics: an entry stored (its subject, and the seconds the attempt that stored it took); an attempt that failed. */
  readonly stored?: (subject: string, seconds: number) => void
  readonly failed?: () => void
}

interface Entry {
  readonly id: string
  readonly subject: string
  readonly data: Uint8Array | string
  readonly lost: ((why: string) => void) | undefined
  readonly headers: MsgHdrs | undefined
  readonly at: number
  acked: boolean
}

export const appender = (js: JetStreamClient, options: AppenderOptions) => {
  // Ids unique across processes and restarts, for the stream's duplicate detection.
  const prefix = randomBytes(6).toString("base64url")
  let seq = 0
  /** Unacknowledged entries, oldest first (acknowledged ones are trimmed off the front). */
  let pending: Array<Entry> = []
  let retry: ReturnType<typeof setTimeout> | undefined
  let lastError = ""

  const trim = () => {
    let n = 0
    while (n < pending.length && pending[n]!.acked) n++
    if (n > 0) pending = pending.slice(n)
  }

  const send = (e: Entry, sent = performance.now()) =>
    js.publish(e.subject, e.data, e.headers === undefined ? { msgID: e.id, timeout: options.timeoutMillis } : { msgID: e.id, timeout: options.timeoutMillis, headers: e.headers }).then(
      () => {
        // Once per entry, though a retry may have sent it twice.
        if (!e.acked) options.stored?.(e.subject, (performance.now() - sent) / 1000)
        e.acked = true
        if (pending[0] === e) trim()
      },
      (cause: unknown) => {
        options.failed?.()
        lastError = cause instanceof Error ? cause.message : String(cause)
        // Unref'd: a retry must not keep a stopping process alive; what it would store is reported lost.
        retry ??= setTimeout(resend, options.retryAfterMillis).unref()
      }
    )

  const dropUnstored = (entries: ReadonlyArray<Entry>, why: string) => {
    const lost = entries.filter((e) => !e.acked)
    if (lost.length === 0) return
    options.lost(lost.length, why)
    for (const e of lost) e.lost?.(why)
  }

  const resend = () => {
    retry = undefined
    trim()
    const cutoff = Date.now() - options.giveUpAfterMillis
    const expired = pending.findIndex((e) => e.at >= cutoff)
    const drop = expired < 0 ? pending.length : expired
    if (drop > 0) {
      dropUnstored(pending.slice(0, drop), `not stored within ${options.giveUpAfterMillis} ms (${lastError})`)
      pending = pending.slice(drop)
    }
    for (const e of pending) if (!e.acked) void send(e)
  }

  return (subject: string, data: Uint8Array | string, lost?: (why: string) => void, headers?: MsgHdrs): void => {
    if (pending.length >= options.maxPending) {
      trim()
      if (pending.length >= options.maxPending) {
        dropUnstored(pending.splice(0, 1), `more than ${options.maxPending} appends waiting to be stored (${lastError})`)
      }
    }
    const e: Entry = { id: `${prefix}.${++seq}`, subject, data, lost, headers, at: Date.now(), acked: false }
    pending.push(e)
    void send(e)
  }
}
