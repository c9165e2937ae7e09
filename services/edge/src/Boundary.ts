/**
 * Where the edge's callbacks (a request, an upgrade, a socket's event, a bus message) meet Effect:
 * they run effects without waiting for them, in fibers that end with the edge, and log what they
 * catch. A bug at one of them costs that request or socket, never the process and everyone on it.
 */
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as FiberRef from "effect/FiberRef"
import * as FiberSet from "effect/FiberSet"
import * as LogLevel from "effect/LogLevel"
import type * as Scope from "effect/Scope"

export interface Boundary {
  /** Runs an effect from a callback, in a fiber the edge's scope interrupts when it closes. */
  readonly runFork: <A, E>(effect: Effect.Effect<A, E>) => unknown
  /** Logs an exception caught at a boundary, with what it was about. */
  readonly logCaught: (what: string, cause: unknown, about: Readonly<Record<string, string>>) => void
  /**
   * Whether debug lines are logged: a callback builds one only then. A log line from a callback
   * runs a fiber, and a line per upgrade at info was a third of what each handshake allocated
   * (issue 29).
   */
  readonly debugLogged: boolean
}

export const make: Effect.Effect<Boundary, never, Scope.Scope> = Effect.gen(function*() {
  const fibers = yield* FiberSet.make()
  const runFork = yield* FiberSet.runtime(fibers)<never>()
  const logCaught = (what: string, cause: unknown, about: Readonly<Record<string, string>>) => {
    try {
      runFork(Effect.logError(what, Cause.die(cause)).pipe(Effect.annotateLogs(about)))
    } catch {
      // Logging after shutdown has nowhere to go.
    }
  }
  const debugLogged = LogLevel.greaterThanEqual(LogLevel.Debug, yield* FiberRef.get(FiberRef.currentMinimumLogLevel))
  return { runFork, logCaught, debugLogged }
})
