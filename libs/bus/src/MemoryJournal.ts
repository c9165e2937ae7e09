/**
 * The embedded adapter of the Journal port: JetStream's semantics in this process's memory, with
 * the byte budget (MCPX_HISTORY_TOTAL_BYTES for MCPx) counting what each entry really costs, since
 * every topic's history is held here for hours.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type { JournalEntry, JournalLog, JournalShape, JournalSpec } from "./Journal.ts"

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
