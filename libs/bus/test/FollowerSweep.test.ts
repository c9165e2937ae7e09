/**
 * The sweep that looks at a bus layer's journal followers belongs to a scope (the layer's): it
 * looks at every follower each period while its scope is open, and at none once it has closed,
 * and two sweeps in one process know nothing of each other's followers. Driven by the test clock.
 */
import { describe, expect, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Queue from "effect/Queue"
import * as Scope from "effect/Scope"
import * as TestClock from "effect/TestClock"
import * as FollowerSweep from "../src/FollowerSweep.ts"

/** A follower that records each time the sweep looks at it. */
const recording = (name: string, looked: Queue.Queue<string>): FollowerSweep.Swept => ({
  check: () => void Queue.unsafeOffer(looked, name)
})

/** Once every fiber the clock woke has run to its next wait, nothing more was looked at. */
const nothingMore = (looked: Queue.Queue<string>) =>
  Effect.gen(function*() {
    yield* Effect.repeatN(Effect.yieldNow(), 10)
    expect([...(yield* Queue.takeAll(looked))]).toEqual([])
  })

/** The next two looked at, in either order. */
const nextTwo = (looked: Queue.Queue<string>) => Effect.map(Effect.all([Queue.take(looked), Queue.take(looked)]), (names) => names.sort())

/** A sweep in a scope of its own, and that scope's end. */
const ownScope = Effect.gen(function*() {
  const scope = yield* Scope.make()
  const sweep = yield* Scope.extend(FollowerSweep.make("3 seconds"), scope)
  return { sweep, close: Scope.close(scope, Exit.void) }
})

describe("FollowerSweep", () => {
  it.scoped("looks at each follower once a period, and at one removed no more", () =>
    Effect.gen(function*() {
      const looked = yield* Queue.unbounded<string>()
      const sweep = yield* FollowerSweep.make("3 seconds")
      const a = recording("a", looked)
      sweep.add(a)
      sweep.add(recording("b", looked))
      yield* TestClock.adjust("2 seconds")
      yield* nothingMore(looked)
      yield* TestClock.adjust("1 second")
      expect(yield* nextTwo(looked)).toEqual(["a", "b"])
      sweep.remove(a)
      yield* TestClock.adjust("3 seconds")
      expect(yield* Queue.take(looked)).toBe("b")
      yield* nothingMore(looked)
    }))

  it.scoped("ends with its scope: nothing is looked at after it closes, nor added", () =>
    Effect.gen(function*() {
      const looked = yield* Queue.unbounded<string>()
      const { close, sweep } = yield* ownScope
      sweep.add(recording("a", looked))
      yield* TestClock.adjust("3 seconds")
      expect(yield* Queue.take(looked)).toBe("a")
      yield* close
      sweep.add(recording("late", looked))
      yield* TestClock.adjust("30 seconds")
      yield* nothingMore(looked)
    }))

  it.scoped("two sweeps in one process each look only at their own followers", () =>
    Effect.gen(function*() {
      const looked = yield* Queue.unbounded<string>()
      const one = yield* ownScope
      const two = yield* ownScope
      one.sweep.add(recording("one", looked))
      two.sweep.add(recording("two", looked))
      yield* TestClock.adjust("3 seconds")
      expect(yield* nextTwo(looked)).toEqual(["one", "two"])
      yield* one.close
      yield* TestClock.adjust("3 seconds")
      expect(yield* Queue.take(looked)).toBe("two")
      yield* nothingMore(looked)
      yield* two.close
    }))
})
