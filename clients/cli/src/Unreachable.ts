/**
 * A tool call that found its upstream (hub or proxy) down: the bridge answers it at once with this
 * message rather than let the host wait, and keeps reconnecting in the background.
 */
import * as Data from "effect/Data"

export class Unreachable extends Data.TaggedError("Unreachable")<{ readonly url: string }> {
  constructor(url: string) {
    super({ url })
  }

  override get message(): string {
    return `Switchboard at ${this.url} is unreachable; reconnecting`
  }
}
