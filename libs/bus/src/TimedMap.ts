/**
 * A Map whose entries expire a fixed time after they were set: an actor's requests in flight, each
 * of which must be answered or timed out. One timer serves the whole map, where a timer per entry
 * would cost an allocation, a closure and a timer-list insert and removal on every request. Since
 * every entry lives equally long, the oldest expires first, and a Map iterates oldest first: only
 * the oldest entry's deadline needs a timer.
 */

/** Counts a map keeps up to date for metrics (see `Instruments.requests`): plain numbers, no lookups. */
export interface InFlight {
  readonly pending: { value: number }
  readonly timeouts: { value: number }
}

export class TimedMap<K, V> {
  private readonly entries = new Map<K, { readonly value: V; readonly expiresAt: number }>()
  private timer: ReturnType<typeof setTimeout> | undefined

  constructor(
    private readonly millis: number,
    /** Called once per expired entry, after it left the map. */
    private readonly onExpired: (key: K, value: V) => void,
    /** Shared by every map of a service; a map of its own when not metered. */
    private readonly inFlight: InFlight = { pending: { value: 0 }, timeouts: { value: 0 } }
  ) {}

  get size() {
    return this.entries.size
  }
  has(key: K) {
    return this.entries.has(key)
  }
  get(key: K): V | undefined {
    return this.entries.get(key)?.value
  }
  /** Adds or replaces an entry; either way its time starts now. */
  set(key: K, value: V) {
    if (!this.entries.delete(key)) this.inFlight.pending.value++
    this.entries.set(key, { value, expiresAt: performance.now() + this.millis })
    if (this.timer === undefined) this.arm()
  }
  delete(key: K) {
    if (!this.entries.delete(key)) return false
    this.inFlight.pending.value--
    return true
  }
  *values(): IterableIterator<V> {
    for (const entry of this.entries.values()) yield entry.value
  }
  /** Empties the map and stops its timer; nothing expires. */
  clear() {
    this.inFlight.pending.value -= this.entries.size
    this.entries.clear()
    if (this.timer !== undefined) clearTimeout(this.timer)
    this.timer = undefined
  }

  private arm() {
    this.timer = undefined
    for (const { expiresAt } of this.entries.values()) {
      // Whole milliseconds: Node keeps one timer list per distinct duration.
      this.timer = setTimeout(this.expire, Math.max(1, Math.ceil(expiresAt - performance.now())))
      return
    }
  }

  private readonly expire = () => {
    const now = performance.now()
    for (const [key, { expiresAt, value }] of this.entries) {
      if (expiresAt > now) break
      this.entries.delete(key)
      this.inFlight.pending.value--
      this.inFlight.timeouts.value++
      this.onExpired(key, value)
    }
    this.arm()
  }
}
