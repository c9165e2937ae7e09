/**
 * A token bucket that refills at `rate` per second up to `burst`, and goes negative while a caller
 * keeps going over, so that persistent abuse can be told from a short excess.
 */
export class RateBudget {
  private tokens: number
  private last = performance.now()
  constructor(
    private readonly rate: number,
    private readonly burst: number
  ) {
    this.tokens = burst
  }
  /** Takes one token: `ok` within the limit, `abusive` once twice the burst over it. */
  take(): "ok" | "limited" | "abusive" {
    const now = performance.now()
    this.tokens = Math.min(this.burst, this.tokens + ((now - this.last) / 1000) * this.rate)
    this.last = now
    this.tokens -= 1
    if (this.tokens >= 0) return "ok"
    return this.tokens < -this.burst ? "abusive" : "limited"
  }
}
