/**
 * What the auth service said of tokens lately, kept for a while so that a token presented again
 * and again (a reconnecting client, a Streamable HTTP client with every request) is asked once.
 * Entries are keyed by a digest of the token, never the token, and bounded by count and by bytes,
 * since anyone can present tokens: 10,000 garbage tokens of 15 KB kept as keys held half a GiB.
 */
import { hash } from "node:crypto"

/**
 * SHA-256 of a token, base64url: 43 characters whatever the token's length. A token as a key kept
 * its whole text alive, and often more (a slice of the request it was cut from). The one-shot
 * `hash`, not a `Hash` object per call: every Streamable HTTP request's token is digested, and the
 * object cost 2.7 times as much (3 % of a modern hub call's CPU at 50×10).
 */
export const digest = (token: string): string => hash("sha256", token, "base64url")

/**
 * The digests of tokens lately found good, by their text: a Streamable HTTP client sends its token
 * with every request, and digesting it each time was 5 % of a legacy hub call's CPU at 1×1. A
 * digest is a function of its token, so nothing kept here goes stale. Only tokens with a good
 * verdict are kept (garbage never is), at most `max`, oldest out first: what it holds is bounded
 * by `max` times the longest token the edge takes.
 */
export class Digests {
  private readonly byToken = new Map<string, string>()

  constructor(readonly max: number) {}

  get size(): number {
    return this.byToken.size
  }

  of(token: string): string {
    return this.byToken.get(token) ?? digest(token)
  }

  /** Remembers `key` as the digest of `token`, which has a good verdict. */
  keep(token: string, key: string): void {
    if (this.byToken.has(token)) return
    this.byToken.set(token, key)
    if (this.byToken.size <= this.max) return
    for (const oldest of this.byToken.keys()) {
      this.byToken.delete(oldest)
      return
    }
  }
}

export interface Limits {
  /** How long a verdict is kept, in milliseconds. */
  readonly keepFor: number
  readonly maxEntries: number
  /** Bytes the table may hold, as estimated by `ENTRY_BYTES` plus the size of each value. */
  readonly maxBytes: number
}

/**
 * What one entry costs besides its value: the digest string (~60 B), the map's slot, and the
 * record holding value, expiry and size. An estimate on the high side, so the byte bound holds.
 */
export const ENTRY_BYTES = 200

interface Entry<A> {
  readonly value: A
  readonly until: number
  readonly bytes: number
}

/**
 * One kind of verdict (good, or refused), oldest first. Every entry of a table is kept equally
 * long, so the oldest is also the first to expire: eviction and sweeping both take from the front,
 * and neither ever drops everything at once, as the old table's `clear()` at capacity did.
 */
export class Verdicts<A> {
  private readonly entries = new Map<string, Entry<A>>()
  private held = 0

  constructor(
    readonly limits: Limits,
    /** Estimated bytes of a value, on top of `ENTRY_BYTES`. */
    private readonly sizeOf: (value: A) => number,
    private readonly now: () => number = Date.now
  ) {}

  get size(): number {
    return this.entries.size
  }

  /** Estimated bytes held, by the same measure `maxBytes` bounds. */
  get bytes(): number {
    return this.held
  }

  /** The verdict kept under `key`, unless it has expired. */
  get(key: string): A | undefined {
    const entry = this.entries.get(key)
    if (entry === undefined) return undefined
    if (entry.until > this.now()) return entry.value
    this.delete(key)
    return undefined
  }

  /** Keeps `value` under `key` as the newest entry, evicting the oldest while over either bound. */
  set(key: string, value: A): void {
    this.delete(key)
    const bytes = ENTRY_BYTES + this.sizeOf(value)
    // A value too big for the table on its own is not kept: it would evict everything else.
    if (bytes > this.limits.maxBytes) return
    this.entries.set(key, { value, until: this.now() + this.limits.keepFor, bytes })
    this.held += bytes
    this.sweep()
    for (const [oldest, entry] of this.entries) {
      if (this.entries.size <= this.limits.maxEntries && this.held <= this.limits.maxBytes) break
      this.entries.delete(oldest)
      this.held -= entry.bytes
    }
  }

  delete(key: string): void {
    const entry = this.entries.get(key)
    if (entry === undefined) return
    this.entries.delete(key)
    this.held -= entry.bytes
  }

  /** Drops the expired entries, which are all at the front. */
  sweep(): void {
    const now = this.now()
    for (const [key, entry] of this.entries) {
      if (entry.until > now) break
      this.entries.delete(key)
      this.held -= entry.bytes
    }
  }
}
