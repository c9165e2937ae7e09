/**
 * What a failure of nats.js means to the ports: every one becomes a BusError that keeps its cause,
 * and the few that are JetStream being unavailable for a while (a server starting, an election) are
 * tried again by the KV and journal adapters, for a bound each of them chooses.
 */
import { JetStreamApiError } from "@nats-io/jetstream"
import { TimeoutError } from "@nats-io/transport-node"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import { BusError } from "./Bus.ts"

export const busError = (reason: BusError["reason"], message: string) => (cause: unknown) =>
  new BusError({ reason, message: `${message}: ${cause instanceof Error ? cause.message : String(cause)}`, cause })

/**
 * JetStream unavailable for now, not for good: no server answers its API (not enabled yet on a
 * server that is starting, nats.js says JetStreamNotEnabled) or a stream has no leader during an
 * election (503). Nothing was applied, so the operation may be tried again.
 */
export const isJetStreamUnavailable = (e: unknown): boolean =>
  // The class is not among the package's exports; its name is.
  (e instanceof Error && e.name === "JetStreamNotEnabled") ||
  (e instanceof JetStreamApiError && e.status === 503) ||
  (e instanceof BusError && isJetStreamUnavailable(e.cause))

/** Soon, then less often: a leader election takes seconds, a server starting a little longer. */
const jetStreamBackoff = Schedule.exponential("100 millis").pipe(Schedule.union(Schedule.spaced("2 seconds")))

/** Tries `effect` again, for up to `bound`, while `transient` says its failure is. */
export const whileJetStreamUnavailable = (bound: Duration.DurationInput, transient: (e: unknown) => boolean = isJetStreamUnavailable) =>
<A, E>(effect: Effect.Effect<A, E>) => Effect.retry(effect, { while: transient, schedule: Schedule.upTo(jetStreamBackoff, bound) })

/**
 * Opening a bucket or journal creates it or opens the existing one, so a request that timed out
 * (sent just before the server restarted, say) can be sent again, which a write cannot.
 */
export const isUnavailableOrTimedOut = (e: unknown): boolean =>
  isJetStreamUnavailable(e) || e instanceof TimeoutError || (e instanceof BusError && isUnavailableOrTimedOut(e.cause))

/**
 * Opening a bucket or journal at start waits for JetStream, with one warning that says so: a
 * service started with (or just before) its NATS, or during an election, would exit otherwise.
 */
export const awaitingJetStream = (what: string, bound: Duration.DurationInput) => <A, E>(effect: Effect.Effect<A, E>) => {
  let warned = false
  return effect.pipe(
    Effect.tapError((e) => {
      if (warned || !isUnavailableOrTimedOut(e)) return Effect.void
      warned = true
      return Effect.logWarning(`JetStream is not available yet (${what}); trying again for up to ${Duration.format(bound)}`)
    }),
    whileJetStreamUnavailable(bound, isUnavailableOrTimedOut)
  )
}

export const DEFAULT_JETSTREAM_WAIT = "60 seconds"
