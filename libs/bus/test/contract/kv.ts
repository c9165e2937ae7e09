/** The Kv port: buckets, compare-and-set, TTL, keys, watch and follow. */
import { describe, expect } from "@effect/vitest"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import * as Stream from "effect/Stream"
import * as Scope from "effect/Scope"
import { Kv } from "../../src/Kv.ts"
import type { Harness } from "./harness.ts"

export const kvContract = <R, E>(name: string, { run, withBus }: Harness<R, E>) => {
  describe(`${name} kv contract`, () => {
    run("contract", (it) => {
      it.scoped("puts, gets, deletes", () =>
        withBus(
          Effect.gen(function*() {
            const kv = yield* (yield* Kv).bucket({ name: "things" })
            expect(Option.isNone(yield* kv.get("k1"))).toBe(true)
            const r1 = yield* kv.put("k1", "one")
            const e = yield* kv.get("k1")
            expect(Option.map(e, (x) => new TextDecoder().decode(x.value))).toEqual(Option.some("one"))
            expect(Option.map(e, (x) => x.revision)).toEqual(Option.some(r1))
            yield* kv.delete("k1")
            expect(Option.isNone(yield* kv.get("k1"))).toBe(true)
          })
        ))

      it.scoped("create is an exclusive claim and update is compare-and-set", () =>
        withBus(
          Effect.gen(function*() {
            const kv = yield* (yield* Kv).bucket({ name: "claims" })
            const r1 = yield* kv.create("conn.a", "replica-1")
            const again = yield* Effect.either(kv.create("conn.a", "replica-2"))
            expect(Either.isLeft(again) && again.left._tag === "KvConflict" && again.left.reason).toBe("Exists")

            const r2 = yield* kv.update("conn.a", "replica-2", r1)
            expect(r2).toBeGreaterThan(r1)
            const stale = yield* Effect.either(kv.update("conn.a", "replica-3", r1))
            expect(Either.isLeft(stale) && stale.left._tag === "KvConflict" && stale.left.reason).toBe("WrongRevision")
            const winner = yield* kv.get("conn.a")
            expect(Option.map(winner, (x) => new TextDecoder().decode(x.value))).toEqual(Option.some("replica-2"))

            // Two claims race: exactly one wins.
            const results = yield* Effect.all([kv.create("conn.b", "x"), kv.create("conn.b", "y")], {
              concurrency: 2,
              mode: "either"
            })
            expect(results.filter(Either.isRight)).toHaveLength(1)

            // A deleted key can be claimed again.
            yield* kv.delete("conn.a")
            yield* kv.create("conn.a", "replica-4")
          })
        ))

      it.scoped("compareAndDelete deletes the revision it names, and not one written since", () =>
        withBus(
          Effect.gen(function*() {
            const kv = yield* (yield* Kv).bucket({ name: "owned" })
            // An owner read its record; another wrote a newer one before the owner let go.
            const mine = yield* kv.put("ext.alice.1", "conn-old")
            const theirs = yield* kv.put("ext.alice.1", "conn-new")
            const stale = yield* Effect.either(kv.compareAndDelete("ext.alice.1", mine))
            expect(Either.isLeft(stale) && stale.left._tag === "KvConflict" && stale.left.reason).toBe("WrongRevision")
            expect(Option.map(yield* kv.get("ext.alice.1"), (e) => new TextDecoder().decode(e.value))).toEqual(Option.some("conn-new"))
            yield* kv.compareAndDelete("ext.alice.1", theirs)
            expect(Option.isNone(yield* kv.get("ext.alice.1"))).toBe(true)
          })
        ))

      it.scoped("lists keys by subject-style filter", () =>
        withBus(
          Effect.gen(function*() {
            const kv = yield* (yield* Kv).bucket({ name: "keys" })
            for (const k of ["ext.alice.1", "ext.alice.2", "ext.bob.1", "mcp.alice.1"]) yield* kv.put(k, k)
            yield* kv.delete("ext.alice.2")
            expect([...(yield* kv.keys("ext.alice.>"))].sort()).toEqual(["ext.alice.1"])
            expect([...(yield* kv.keys("ext.*.1"))].sort()).toEqual(["ext.alice.1", "ext.bob.1"])
            expect((yield* kv.keys()).length).toBe(3)
          })
        ))

      it.scoped("counts keys by subject-style filter, a deleted one at most until its marker ages out", () =>
        withBus(
          Effect.gen(function*() {
            const kv = yield* (yield* Kv).bucket({ name: "counted" })
            for (const k of ["ext.alice.1", "ext.alice.2", "ext.bob.1", "mcp.alice.1"]) yield* kv.put(k, k)
            yield* kv.put("ext.alice.1", "again")
            expect(yield* kv.count("ext.alice.>")).toBe(2)
            expect(yield* kv.count("ext.*.1")).toBe(2)
            expect(yield* kv.count()).toBe(4)
            expect(yield* kv.count("nobody.>")).toBe(0)
            yield* kv.delete("ext.alice.2")
            expect(yield* kv.count("ext.alice.>")).toBeGreaterThanOrEqual(1)
            expect(yield* kv.count("ext.alice.>")).toBeLessThanOrEqual(2)
          })
        ))

      it.scoped("watches initial values, updates and deletes", () =>
        withBus(
          Effect.gen(function*() {
            const kv = yield* (yield* Kv).bucket({ name: "watched" })
            yield* kv.put("w.1", "before")
            yield* kv.put("other", "ignored")
            const q = yield* Queue.unbounded<string>()
            yield* kv.watch({ key: "w.>", initial: true }).pipe(
              Stream.runForEach((e) => Queue.offer(q, `${e.operation} ${e.key} ${new TextDecoder().decode(e.value)}`)),
              Effect.forkScoped
            )
            expect(yield* Queue.take(q)).toBe("PUT w.1 before")
            yield* kv.put("w.2", "after")
            yield* kv.put("other", "still ignored")
            yield* kv.delete("w.1")
            const next = yield* Effect.all([Queue.take(q), Queue.take(q)]).pipe(Effect.timeout("10 seconds"))
            expect(next).toEqual(["PUT w.2 after", "DEL w.1 "])
          })
        ))

      it.scoped("follows: the values there were before it returns, then changes in order, until its scope closes", () =>
        withBus(
          Effect.gen(function*() {
            const kv = yield* (yield* Kv).bucket({ name: "followed" })
            yield* kv.put("f.1", "before")
            yield* kv.put("other", "ignored")
            const applied = yield* Queue.unbounded<string>()
            const scope = yield* Scope.make()
            yield* kv.follow("f.>", (e) => Queue.unsafeOffer(applied, `${e.operation} ${e.key} ${new TextDecoder().decode(e.value)}`)).pipe(Scope.extend(scope))
            // Returned means applied. The NATS adapter may hand a value over twice (its watch's
            // replay and its read of the keys), and the first may come again below.
            expect(new Set(yield* Queue.takeAll(applied))).toEqual(new Set(["PUT f.1 before"]))
            yield* kv.put("f.2", "after")
            yield* kv.put("other", "still ignored")
            yield* kv.delete("f.1")
            const changes: Array<string> = []
            while (changes.length < 2) {
              const change = yield* Queue.take(applied).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error(`only ${changes} followed`) }))
              if (change !== "PUT f.1 before") changes.push(change)
            }
            expect(changes).toEqual(["PUT f.2 after", "DEL f.1 "])

            yield* Scope.close(scope, Exit.void)
            yield* kv.put("f.3", "unfollowed")
            // A round trip to the server, for an entry sent to a watch that still ran to show.
            yield* kv.get("f.3")
            expect(yield* Queue.size(applied)).toBe(0)
          })
        ))

      it.scoped("expires entries after the bucket TTL", () =>
        withBus(
          Effect.gen(function*() {
            const kv = yield* (yield* Kv).bucket({ name: "heartbeats", ttl: "1 second" })
            yield* kv.put("edge-1", "alive")
            expect(Option.isSome(yield* kv.get("edge-1"))).toBe(true)
            // Poll until gone; bounded so a broken TTL fails rather than hangs.
            yield* kv.get("edge-1").pipe(
              Effect.filterOrFail(Option.isNone, () => new Error("edge-1 has not expired yet")),
              Effect.retry(Schedule.spaced("100 millis")),
              Effect.timeout("6 seconds")
            )
            expect(yield* kv.keys()).toEqual([])
          })
        ), 15_000)
    })
  })
}
