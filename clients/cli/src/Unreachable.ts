/**
 * A tool call that found its upstream (hub or proxy) down: the bridge answers it at once with this
 * message rather than let the host wait, and keeps reconnecting in the background.
 */
import * as Data from "effect/Data"

export class Unreachable extends Data.TaggedError("Unreachable")<{ readonly url: string; readonly atStart: string | undefined }> {
  /** `atStart`: why the first connection has not come up, for a host's initialize. */
  constructor(url: string, atStart?: string) {
    super({ url, atStart })
  }

  override get message(): string {
    return this.atStart === undefined
      ? `Switchboard at ${this.url} is unreachable; reconnecting`
      : `cannot reach Switchboard at ${this.url} (${this.atStart}): check --url and that Switchboard is running`
  }
}
