/**
 * One timer that looks at every journal follower of a bus layer, rather than one each (there is one
 * per followed topic), so a follower whose consumer went quiet is noticed and replaced. The timer
 * and its set live in the layer's scope: they end with it, and two layers in one process (tests,
 * the chaos suite's observers) each have their own.
 */
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"

/** What the sweep asks of a follower: to look at how long it has been quiet, and act on it. */
export interface Swept {
  readonly check: (now: number) => void
}

export interface FollowerSweep {
  /** Looked at on every sweep from now on; nothing once the sweep's scope has closed. */
  readonly add: (follower: Swept) => void
  readonly remove: (follower: Swept) => void
}

/** How often the followers are looked at; well within FOLLOW_STALE_MS, the quiet that is too long. */
export const FOLLOWER_SWEEP = "3 seconds"

export const make = (every: Duration.DurationInput = FOLLOWER_SWEEP): Effect.Effect<FollowerSweep, never, Scope.Scope> =>
  Effect.gen(function*() {
    const followers = new Set<Swept>()
    let ended = false
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        ended = true
        followers.clear()
      })
    )
    yield* Effect.sync(() => {
      const now = Date.now()
      for (const f of followers) f.check(now)
    }).pipe(Effect.delay(every), Effect.forever, Effect.forkScoped)
    return {
      add: (follower) => void (ended || followers.add(follower)),
      remove: (follower) => void followers.delete(follower)
    }
  })
