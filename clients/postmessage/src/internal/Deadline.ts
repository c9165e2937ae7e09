/**
 * A promise that is settled once, and rejected with a given error when its time runs out: the
 * shape of every handshake wait.
 */
export class Deadline<A> {
  readonly promise: Promise<A>
  private settle: { resolve: (value: A) => void; reject: (error: Error) => void } | undefined
  private timer: ReturnType<typeof setTimeout> | undefined

  constructor() {
    this.promise = new Promise<A>((resolve, reject) => {
      this.settle = { resolve, reject }
    })
    // A wait nobody awaits (a transport closed before it started) must not be an unhandled rejection.
    this.promise.catch(() => undefined)
  }

  get pending(): boolean {
    return this.settle !== undefined
  }

  /** Starts (or restarts) the clock. */
  arm(ms: number, error: () => Error): void {
    clearTimeout(this.timer)
    if (!this.pending) return
    this.timer = setTimeout(() => this.reject(error()), ms)
  }

  resolve(value: A): void {
    this.finish()?.resolve(value)
  }

  reject(error: Error): void {
    this.finish()?.reject(error)
  }

  private finish() {
    clearTimeout(this.timer)
    const settle = this.settle
    this.settle = undefined
    return settle
  }
}
