/**
 * Tab entries outlive their socket only when every replica that could clean them up died with
 * it; this sweep removes them once they are old enough and no connection owns them. Every replica
 * runs it; a tab whose socket is open anywhere has a connection record, and stays.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import type * as Replica from "./Replica.ts"

/** One pass over the user's tab entries: how many it removed. */
export const sweep = (replica: Replica.Replica) =>
  Effect.gen(function*() {
    const { connections, tabs } = replica
    const staleMillis = Duration.toMillis(replica.config.staleTabAge)
    let pruned = 0
    for (const { key, value } of yield* tabs.values()) {
      if (Date.now() - value.updatedAt < staleMillis) continue
      if (Option.isSome(yield* connections.get(value.conn))) continue
      // Not a record the tab wrote again since it was read.
      if (!(yield* tabs.deleteOwned(key, (now) => now.conn === value.conn && now.updatedAt === value.updatedAt))) continue
      pruned++
      replica.toolsChanged(value.user)
      yield* Effect.logInfo(`pruned the stale entry of tab ${value.tabId} of ${value.domain}`)
    }
    return pruned
  })

/** The sweep, again and again (at most a minute apart) while the scope lasts. */
export const run = (replica: Replica.Replica) =>
  sweep(replica).pipe(
    Effect.catchAll((e) => Effect.logWarning("pruning stale tabs failed", e)),
    Effect.repeat(Schedule.spaced(Duration.min(replica.config.staleTabAge, Duration.minutes(1)))),
    Effect.forkScoped
  )
