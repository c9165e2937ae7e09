/**
 * `Effect.acquireRelease` for what a connection's actor holds for its whole life (a subscription,
 * a request map, a timer, a view): its release needs nothing of the fiber that acquired it.
 * acquireRelease keeps that fiber's refs (a FiberRefs with its own Map, about 1 KB) for as long as
 * the resource lives, to run the release under them; with several resources per connection, that
 * was a good part of what an idle connection cost (issue 16).
 */
import * as Effect from "effect/Effect"
import * as Scope from "effect/Scope"

/** Acquires, and releases when the scope closes, under the closing fiber's refs. */
export const acquireRelease = <A, E, R>(
  acquire: Effect.Effect<A, E, R>,
  release: (a: A) => Effect.Effect<unknown>
): Effect.Effect<A, E, R | Scope.Scope> =>
  // addFinalizerExit hands the function to the scope as it is: what stays is one closure, and the release's Effect is built
  // only when the scope closes.
  Effect.uninterruptible(Effect.flatMap(Scope.Scope, (scope) => Effect.tap(acquire, (a) => Scope.addFinalizerExit(scope, () => release(a)))))

/** The same, for a release that is a plain function. */
export const acquireReleaseSync = <A, E, R>(acquire: Effect.Effect<A, E, R>, release: (a: A) => void): Effect.Effect<A, E, R | Scope.Scope> =>
  Effect.uninterruptible(Effect.flatMap(Scope.Scope, (scope) => Effect.tap(acquire, (a) => Scope.addFinalizerExit(scope, () => Effect.sync(() => release(a))))))
