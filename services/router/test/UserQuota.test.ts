/** The per-user cap on sockets: seats are taken up to the limit and come back when a socket's scope ends. */
import { describe, expect, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Scope from "effect/Scope"
import { UserQuota } from "../src/UserQuota.ts"

describe("UserQuota", () => {
  it.effect("takes seats up to the limit per user, forces an adopted one past it, and frees each when its scope closes", () =>
    Effect.gen(function*() {
      const quota = new UserQuota(2)
      const [a, b, c, d] = yield* Effect.all([Scope.make(), Scope.make(), Scope.make(), Scope.make()])
      expect(yield* quota.take("alice", a)).toBe(true)
      expect(yield* quota.take("alice", b)).toBe(true)
      expect(yield* quota.take("alice", c)).toBe(false)
      expect(yield* quota.take("bob", c)).toBe(true)
      expect(yield* quota.take("alice", d, true)).toBe(true)
      expect(quota.count("alice")).toBe(3)
      yield* Scope.close(a, Exit.void)
      yield* Scope.close(d, Exit.void)
      expect(quota.count("alice")).toBe(1)
      yield* Scope.close(b, Exit.void)
      expect(quota.count("alice")).toBe(0)
      expect(quota.count("bob")).toBe(1)
    }))
})
