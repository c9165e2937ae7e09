/**
 * Open connections counted per key (a remote address, a user), refused past a limit, so that one
 * peer cannot hold the sockets, memory and actors that everyone else needs. The edge counts what
 * it knows at the upgrade; the router counts users who authenticate in-band. A count is dropped
 * when it reaches zero: keys that come and go cost nothing once their sockets are gone.
 */
export class ConnectionLimit {
  private readonly open = new Map<string, number>()

  /** `max` connections per key; 0 counts nothing and refuses nothing. */
  constructor(readonly max: number) {}

  /**
   * Takes a slot for `key`: the function that gives it back (idempotent), or undefined when `key`
   * already holds `max`. `force` takes one regardless (a socket adopted from another replica was
   * admitted there).
   */
  take(key: string, force = false): (() => void) | undefined {
    if (!this.tryTake(key, force)) return undefined
    if (this.max <= 0) return noop
    let held = true
    return () => {
      if (!held) return
      held = false
      this.give(key)
    }
  }

  /**
   * Takes a slot for `key` without a function to give it back: false when `key` already holds
   * `max`. For a caller that remembers what it took, and gives it back once, with `give`.
   */
  tryTake(key: string, force = false): boolean {
    if (this.max <= 0) return true
    const n = this.open.get(key) ?? 0
    if (n >= this.max && !force) return false
    this.open.set(key, n + 1)
    return true
  }

  /** Gives back a slot `tryTake` took. */
  give(key: string): void {
    if (this.max <= 0) return
    const left = (this.open.get(key) ?? 1) - 1
    if (left <= 0) this.open.delete(key)
    else this.open.set(key, left)
  }

  /** Slots `key` holds now. */
  count(key: string): number {
    return this.open.get(key) ?? 0
  }
}

const noop = () => undefined
