/**
 * Reconnect delays for a client's socket: doubling from `initialMillis` to `maxMillis`, each drawn
 * from the upper half of its step, so a restarted server is not met by every client in the same
 * millisecond and no delay is near 0. One implementation for the stdio bridge and the extension.
 */
export interface BackoffOptions {
  /** The first step; 250 ms unless given. */
  readonly initialMillis?: number
  /** The longest step; 10 s unless given. */
  readonly maxMillis?: number
  /** For tests: a fixed draw in [0, 1]. */
  readonly random?: () => number
}

export class Backoff {
  private attempt = 0
  private readonly initial: number
  private readonly max: number
  private readonly random: () => number

  constructor(options: BackoffOptions = {}) {
    this.initial = options.initialMillis ?? 250
    this.max = options.maxMillis ?? 10_000
    this.random = options.random ?? Math.random
  }

  /** The delay before the next attempt. */
  next(): number {
    // The exponent is capped only so that a long outage never overflows to Infinity.
    const step = Math.min(this.max, this.initial * 2 ** Math.min(this.attempt, 30))
    this.attempt++
    return Math.round(step / 2 + (this.random() * step) / 2)
  }

  /** After a connection that held: the next delay is the first step again. */
  reset(): void {
    this.attempt = 0
  }
}
