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

/** Lets every fiber the clock woke run to its next wait. */
const settle = Effect.repeatN(Effect.yieldNow(), 10)

const drained = (looked: Queue.Queue<string>) => Effect.map(Queue.takeAll(looked), (names) => [...names])

describe("FollowerSweep", () => {
  it.scoped("looks at each follower once a period, and at one removed no more", () =>
    Effect.gen(function*() {
      const looked = yield* Queue.unbounded<string>()
      const sweep = yield* FollowerSweep.make("3 seconds")
      const a = recording("a", looked)
      sweep.add(a)
      sweep.add(recording("b", looked))
      yield* TestClock.adjust("2 seconds")
      yield* settle
      expect(yield* drained(looked)).toEqual([])
      yield* TestClock.adjust("1 second")
      expect([yield* Queue.take(looked), yield* Queue.take(looked)].sort()).toEqual(["a", "b"])
      sweep.remove(a)
      yield* TestClock.adjust("3 seconds")
      expect(yield* Queue.take(looked)).toBe("b")
      yield* settle
      expect(yield* drained(looked)).toEqual([])
    }))

  it.scoped("ends with its scope: nothing is looked at after it closes, nor added", () =>
    Effect.gen(function*() {
      const looked = yield* Queue.unbounded<string>()
      const scope = yield* Scope.make()
      const sweep = yield* Scope.extend(FollowerSweep.make("3 seconds"), scope)
      sweep.add(recording("a", looked))
      yield* TestClock.adjust("3 seconds")
      expect(yield* Queue.take(looked)).toBe("a")
      yield* Scope.close(scope, Exit.void)
      sweep.add(recording("late", looked))
      yield* TestClock.adjust("30 seconds")
      yield* settle
      expect(yield* drained(looked)).toEqual([])
    }))

  it.scoped("two sweeps in one process each look only at their own followers", () =>
    Effect.gen(function*() {
      const looked = yield* Queue.unbounded<string>()
      const first = yield* Scope.make()
      const second = yield* Scope.make()
      const one = yield* Scope.extend(FollowerSweep.make("3 seconds"), first)
      const two = yield* Scope.extend(FollowerSweep.make("3 seconds"), second)
      one.add(recording("one", looked))
      two.add(recording("two", looked))
      yield* TestClock.adjust("3 seconds")
      expect([yield* Queue.take(looked), yield* Queue.take(looked)].sort()).toEqual(["one", "two"])
      yield* Scope.close(first, Exit.void)
      yield* TestClock.adjust("3 seconds")
      expect(yield* Queue.take(looked)).toBe("two")
      yield* settle
      expect(yield* drained(looked)).toEqual([])
      yield* Scope.close(second, Exit.void)
    }))
})
