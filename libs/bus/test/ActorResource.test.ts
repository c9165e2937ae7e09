import { describe, expect, it } from "@effect/vitest"
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

  it.live("stops an actor's timers with its scope: a deadline never fires, an interval stops", () =>
    Effect.gen(function*() {
      let fired = 0
      let beats = 0
      const scope = yield* Scope.make()
      yield* Scope.extend(ActorTimer.after("20 millis", () => fired++), scope)
      yield* Scope.extend(ActorTimer.every("5 millis", () => beats++), scope)
      yield* Effect.sleep("12 millis")
      yield* Scope.close(scope, Exit.void)
      const seen = beats
      expect(seen).toBeGreaterThan(0)
      yield* Effect.sleep("40 millis")
      expect(fired).toBe(0)
      expect(beats).toBe(seen)
    }))
})
