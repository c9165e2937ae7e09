/**
 * An actor's timers without a fiber: a keepalive and an authentication deadline wait for most of
 * a connection's life, and a fiber sleeping in `Effect.sleep` holds its stack and fiber refs all
 * that time, several KB per idle connection (issue 16). A Node timer costs one object. Each timer
 * lives in the actor's scope, so it ends with the actor whatever ends it.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import { acquireReleaseSync } from "./ActorResource.ts"

export interface ActorTimer {
  /** Stops it; harmless once it fired or the scope closed. */
  readonly cancel: () => void
}

/**
 * What stays per timer while it waits: this, and one finalizer in the actor's scope. A cancelled
 * timer lets go of Node's: a deadline that was met (a tab's hello) stays in the scope's
 * finalizers for the connection's life, and would keep its Timeout, about 120 bytes (issue 16).
 */
class NodeTimer implements ActorTimer {
  constructor(private handle: ReturnType<typeof setTimeout> | undefined) {}
  cancel() {
    clearTimeout(this.handle)
    this.handle = undefined
  }
}

const cancel = (timer: NodeTimer) => timer.cancel()
const scoped = (start: () => ReturnType<typeof setTimeout>): Effect.Effect<ActorTimer, never, Scope.Scope> =>
  acquireReleaseSync(Effect.sync(() => new NodeTimer(start())), cancel)

/**
 * Runs `f` once, `delay` from now, unless cancelled or the scope closed first. `f` runs outside
 * any fiber: it must be synchronous and must not throw (sending a frame, asking for a close).
 */
export const after = (delay: Duration.DurationInput, f: () => void) => scoped(() => setTimeout(f, Duration.toMillis(delay)))

/** Runs `f` every `period` until cancelled or the scope closes; the same rules as `after`. */
export const every = (period: Duration.DurationInput, f: () => void) => scoped(() => setInterval(f, Duration.toMillis(period)))
