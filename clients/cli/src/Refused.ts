/**
 * Switchboard refused the bridge in a way that retrying cannot change (a token it does not accept,
 * an origin it does not allow, no endpoint at that path). Unlike `Unreachable`, the link stops
 * trying: only a new configuration, so a restarted bridge, can succeed.
 */
import * as Data from "effect/Data"

/** The upgrade statuses that are the configuration's fault, not the network's. */
export const permanent = (status: number): boolean => status === 401 || status === 403 || status === 404

export class Refused extends Data.TaggedError("Refused")<{ readonly url: string; readonly endpoint: string; readonly status: number }> {
  override get message(): string {
    switch (this.status) {
      case 401:
        return `Switchboard at ${this.url} refused the token (HTTP 401): check --token or SWITCHBOARD_TOKEN`
      case 403:
        return `Switchboard at ${this.url} refused the connection (HTTP 403: origin not allowed)`
      case 404:
        return `${this.url} has no Switchboard ${this.endpoint} endpoint (HTTP 404): check --url`
      default:
        return `Switchboard at ${this.url} refused the connection (HTTP ${this.status})`
    }
  }
}
