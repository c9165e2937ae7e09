/**
 * Reconnect delays: 250 ms doubling to 10 s, each drawn from the upper half of its step (so a
 * restarted server is not met by every bridge in the same millisecond, and no delay is near 0).
 */
export interface BackoffOptions {
  readonly initialMillis?: number
  readonly maxMillis?: number
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
    const step = Math.min(this.max, this.initial * 2 ** Math.min(this.attempt, 30))
    this.attempt++
    return Math.round(step / 2 + (this.random() * step) / 2)
  }

  reset(): void {
    this.attempt = 0
  }
}
