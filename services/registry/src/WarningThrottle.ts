/**
 * Warnings a client can cause, at most one per interval per connection: a tab that sends the same
 * bad frame in a loop costs one log line per interval, not one per frame. Nothing is dropped
 * unseen: what is held back is counted, and the next warning that goes out says how many.
 */
export class WarningThrottle {
  private last = Number.NEGATIVE_INFINITY
  private held = 0

  constructor(
    private readonly intervalMillis: number,
    private readonly now: () => number = Date.now
  ) {}

  /** The line to log now, with the count held back since the last one; undefined to hold this one back. */
  admit(message: string): string | undefined {
    const t = this.now()
    if (t - this.last < this.intervalMillis) {
      this.held++
      return undefined
    }
    this.last = t
    const held = this.held
    this.held = 0
    return held === 0 ? message : `${message} (and ${held} similar warning(s) held back since the last one)`
  }
}
