/**
 * `Effect.acquireRelease` for what a connection's actor holds for its whole life (a subscription,
 * a request map, a timer, a view): its release needs nothing of the fiber that acquired it.
 * acquireRelease keeps that fiber's refs (a FiberRefs with its own Map, about 1 KB) for as long as
 * the resource lives, to run the release under them; with several resources per connection, that
 * was a good part of what an idle connection cost (issue 16).
 */
import * as Effect from "effect/Effect"
import * as Scope from "effect/Scope"

/**
 * The finalizer that releases `a`: one closure whose context holds these two and nothing of its
 * caller's (a closure made inside `acquireRelease` also kept the scope and the acquiring Effect,
 * three contexts a resource: issue 29). Its Effect is built only when the scope closes.
 */
const releasing = <A>(release: (a: A) => void, a: A): Scope.Scope.Finalizer => () => Effect.sync(() => release(a))
const call = (f: () => void) => f()

/** Acquires, and releases with a plain function when the scope closes. */
export const acquireReleaseSync = <A, E, R>(acquire: Effect.Effect<A, E, R>, release: (a: A) => void): Effect.Effect<A, E, R | Scope.Scope> =>
  Effect.uninterruptible(Effect.flatMap(Scope.Scope, (scope) => Effect.tap(acquire, (a) => Scope.addFinalizerExit(scope, releasing(release, a)))))

/** Calls `release` when `scope` closes: one closure stays, where `Scope.addFinalizer` with an `Effect.sync` keeps three objects. */
export const onClose = (scope: Scope.Scope, release: () => void): Effect.Effect<void> => Scope.addFinalizerExit(scope, releasing(call, release))
