import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import { acquireReleaseSync } from "./ActorResource.ts"

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
  /**
   * A map that stops with the scope: an actor's pending requests must not expire after the actor
   * ended (handed over or stopped with its replica), when their errors would go out on a bus that
   * drains, or to a client the new owner already answers.
   */
  static make<K, V>(millis: number, onExpired: (key: K, value: V) => void, inFlight?: InFlight): Effect.Effect<TimedMap<K, V>, never, Scope.Scope> {
    return acquireReleaseSync(Effect.sync(() => new TimedMap<K, V>(millis, onExpired, inFlight)), (map) => map.clear())
  }

  private readonly entries_ = new Map<K, { readonly value: V; readonly expiresAt: number }>()
  private timer: ReturnType<typeof setTimeout> | undefined

  constructor(
    private readonly millis: number,
    /** Called once per expired entry, after it left the map. */
    private readonly onExpired: (key: K, value: V) => void,
    /** Shared by every map of a service; a map of its own when not metered. */
    private readonly inFlight: InFlight = { pending: { value: 0 }, timeouts: { value: 0 } }
  ) {}

  get size() {
    return this.entries_.size
  }
  has(key: K) {
    return this.entries_.has(key)
  }
  get(key: K): V | undefined {
    return this.entries_.get(key)?.value
  }
  /** Adds or replaces an entry; either way its time starts now. */
  set(key: K, value: V) {
    if (!this.entries_.delete(key)) this.inFlight.pending.value++
    this.entries_.set(key, { value, expiresAt: performance.now() + this.millis })
    if (this.timer === undefined) this.arm()
  }
  delete(key: K) {
    if (!this.entries_.delete(key)) return false
    this.inFlight.pending.value--
    return true
  }
  *entries(): IterableIterator<readonly [K, V]> {
    for (const [key, entry] of this.entries_) yield [key, entry.value]
  }
  *values(): IterableIterator<V> {
    for (const entry of this.entries_.values()) yield entry.value
  }
  /** Empties the map and stops its timer; nothing expires. */
  clear() {
    this.inFlight.pending.value -= this.entries_.size
    this.entries_.clear()
    if (this.timer !== undefined) clearTimeout(this.timer)
    this.timer = undefined
  }

  private arm() {
    this.timer = undefined
    for (const { expiresAt } of this.entries_.values()) {
      // Whole milliseconds: Node keeps one timer list per distinct duration.
      this.timer = setTimeout(this.expire, Math.max(1, Math.ceil(expiresAt - performance.now())))
      return
    }
  }

  private readonly expire = () => {
    const now = performance.now()
    for (const [key, { expiresAt, value }] of this.entries_) {
      if (expiresAt > now) break
      this.entries_.delete(key)
      this.inFlight.pending.value--
      this.inFlight.timeouts.value++
      this.onExpired(key, value)
    }
    this.arm()
  }
}
