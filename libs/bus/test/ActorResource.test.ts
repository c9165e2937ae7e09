import { describe, expect, it, vi } from "@effect/vitest"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Scope from "effect/Scope"
import * as ActorResource from "../src/ActorResource.ts"
import * as ActorTimer from "../src/ActorTimer.ts"

describe("ActorResource", () => {
  it.effect("releases what it acquired once, when the scope closes, and each release after the later ones", () =>
    Effect.gen(function*() {
      const log: Array<string> = []
      const scope = yield* Scope.make()
      const a = yield* Scope.extend(ActorResource.acquireReleaseSync(Effect.succeed("a"), (x) => log.push(`release ${x}`)), scope)
      yield* ActorResource.onClose(scope, () => log.push("closed"))
      expect(a).toBe("a")
      expect(log).toEqual([])
      yield* Scope.close(scope, Exit.void)
      yield* Scope.close(scope, Exit.void)
      expect(log).toEqual(["closed", "release a"])
    }))

  it.effect("releases at once what is added to a scope already closed", () =>
    Effect.gen(function*() {
      const log: Array<string> = []
      const scope = yield* Scope.make()
      yield* Scope.close(scope, Exit.void)
      yield* ActorResource.onClose(scope, () => log.push("closed"))
      expect(log).toEqual(["closed"])
    }))

  it("fires a deadline once at its time, and stops an actor's timers with its scope", () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "setInterval", "clearInterval"] })
    try {
      let fired = 0
      let beats = 0
      let kept = 0
      const scope = Effect.runSync(Scope.make())
      const other = Effect.runSync(Scope.make())
      Effect.runSync(Scope.extend(ActorTimer.after("20 millis", () => fired++), scope))
      Effect.runSync(Scope.extend(ActorTimer.every("5 millis", () => beats++), scope))
      Effect.runSync(Scope.extend(ActorTimer.after("20 millis", () => kept++), other))
      vi.advanceTimersByTime(12)
      expect(beats).toBe(2)
      Effect.runSync(Scope.close(scope, Exit.void))
      vi.advanceTimersByTime(40)
      expect(fired).toBe(0)
      expect(beats).toBe(2)
      expect(kept).toBe(1)
      Effect.runSync(Scope.close(other, Exit.void))
    } finally {
      vi.useRealTimers()
    }
  })
})
