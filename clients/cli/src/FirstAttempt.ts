/**
 * Settles once a link's first connection attempt has succeeded or failed. A host lists and calls
 * tools as soon as it has initialized, which is before the bridge's first connection is up; what
 * it asks waits for that attempt (briefly), rather than hearing "unreachable" from a server that
 * is about to answer.
 */
import { setTimeout as sleep } from "node:timers/promises"

export class FirstAttempt {
  private settle: () => void = () => {}
  private readonly settled = new Promise<void>((resolve) => (this.settle = resolve))

  done(): void {
    this.settle()
  }

  /** Resolves when the first attempt is over, or after `millis`, whichever comes first. */
  wait(millis: number): Promise<void> {
    return Promise.race([this.settled, sleep(millis, undefined, { ref: false })])
  }
}
