/**
 * What the soak tests share: a tally of successes and failures per workload, loops that run a
 * round until told to stop, and the wait for a process to have closed every socket. A failure is
 * recorded against its workload instead of ending the soak, so that one run reports them all.
 */
import * as Deferred from "effect/Deferred"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import type { EdgeProcess } from "./Processes.ts"

/** What a soak saw: successes per workload, and anything that went wrong. */
export class Tally {
  readonly counts = new Map<string, number>()
  readonly failures: Array<string> = []
  count(what: string) {
    this.counts.set(what, (this.counts.get(what) ?? 0) + 1)
  }
  fail(what: string, detail: unknown) {
    const text = typeof detail === "string" ? detail : JSON.stringify(detail)
    if (this.failures.length < 50) this.failures.push(`${what}: ${text.slice(0, 400)}`)
  }
  /** Runs `check`; a defect or a failed expectation is recorded against `what` instead of ending the soak. */
  run<E>(what: string, check: Effect.Effect<void, E>) {
    return check.pipe(
      Effect.matchCauseEffect({
        onSuccess: () => Effect.sync(() => this.count(what)),
        onFailure: (cause) => Effect.sync(() => this.fail(what, String(cause).split("\n")[0]))
      })
    )
  }
}

/** Runs `body` again and again until `until` is done, pausing `pace` between rounds. */
export const repeatUntil = <E, R>(until: Deferred.Deferred<void>, pace: Duration.DurationInput, body: Effect.Effect<void, E, R>) =>
  Effect.gen(function*() {
    while (!(yield* Deferred.isDone(until))) {
      yield* body
      yield* Effect.sleep(pace)
    }
  })

/** A failed expectation inside a soak round, with what was seen. */
export const expectThat = (ok: boolean, detail: unknown) => (ok ? Effect.void : Effect.dieMessage(JSON.stringify(detail).slice(0, 400)))

/** Polls /metrics until the edge reports no open connection on any path. */
export const allClosed = (proc: EdgeProcess) =>
  Effect.promise(() => fetch(`${proc.url}/metrics`).then((r) => r.text())).pipe(
    Effect.flatMap((text) => (/^switchboard_edge_connections\{[^}]*\} [1-9]/m.test(text) ? Effect.fail("open") : Effect.void)),
    Effect.retry({ schedule: Schedule.spaced("100 millis"), times: 200 }),
    Effect.orDie
  )
