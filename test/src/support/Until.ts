/**
 * Waits for a condition that no event announces (a counter on the other side of a process, a log
 * line): checked every `every`, for up to 500 tries, and a clear failure naming `what` otherwise.
 */
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"

export const until = (ok: () => boolean, what: string, every: Duration.DurationInput = "10 millis") =>
  Effect.suspend(() => (ok() ? Effect.void : Effect.fail(what))).pipe(
    Effect.retry({ schedule: Schedule.spaced(every), times: 500 }),
    Effect.orDieWith((w) => new Error(`never: ${w}`))
  )
