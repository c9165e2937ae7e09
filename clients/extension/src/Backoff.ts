/**
 * Reconnect delays: 500 ms doubling to 30 s, each drawn from the upper half of its step, so a
 * restarted server is not met by every browser in the same millisecond.
 */
export class Backoff {
  private attempt = 0

  constructor(
    private readonly initialMillis = 500,
    private readonly maxMillis = 30_000
  ) {}

  next(): number {
    const step = Math.min(this.maxMillis, this.initialMillis * 2 ** Math.min(this.attempt, 20))
    this.attempt++
    return Math.round(step / 2 + (Math.random() * step) / 2)
  }

  reset(): void {
    this.attempt = 0
  }
}
