/** The Journal port: appends, reads, limits and follow. */
import { describe, expect } from "@effect/vitest"
import * as Effect from "effect/Effect"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import { Journal, type JournalLog, type JournalSpec, type ReadOptions } from "../../src/Journal.ts"
import type { Harness } from "./harness.ts"

export const journalContract = <R, E>(name: string, { run, withBus }: Harness<R, E>) => {
  describe(`${name} journal contract`, () => {
    run("contract", (it) => {
      const spec = (name: string, limits: Partial<JournalSpec> = {}): JournalSpec => ({
        name,
        maxMessagesPerKey: 5,
        maxAge: "1 hour",
        maxBytes: 1_000_000,
        retryFor: "30 seconds",
        ...limits
      })
      /** A read's entries, for the tests that are not about pages. */
      const entriesOf = (log: JournalLog, key: string, options: ReadOptions) => Effect.map(log.read(key, options), (page) => page.entries)
      const text = (entries: ReadonlyArray<{ readonly data: Uint8Array }>) => entries.map((e) => new TextDecoder().decode(e.data))
      /** Appends are not awaited: polls (bounded) until `done` holds. */
      const until = <A>(read: Effect.Effect<A, unknown>, done: (a: A) => boolean) =>
        read.pipe(
          Effect.filterOrFail(done, () => new Error("not stored yet")),
          Effect.retry(Schedule.spaced("20 millis")),
          Effect.timeout("5 seconds")
        )

      it.scoped("appends in order, reads a key's newest before a cursor, and keeps only the newest N per key", () =>
        withBus(
          Effect.gen(function*() {
            const journal = yield* (yield* Journal).open(spec("history"))
            expect(yield* entriesOf(journal, "a", { limit: 10 })).toEqual([])
            // Two keys interleaved: each keeps its own newest five, and sequences are the journal's.
            for (let i = 1; i <= 8; i++) {
              journal.append("a", `a${i}`)
              journal.append("b", `b${i}`)
            }
            const all = yield* until(entriesOf(journal, "a", { limit: 10 }), (es) => es.length === 5 && text(es)[4] === "a8")
            expect(text(all)).toEqual(["a4", "a5", "a6", "a7", "a8"])
            expect(all.map((e) => e.seq)).toEqual([7, 9, 11, 13, 15])
            expect(all.every((e) => e.at > Date.now() - 60_000 && e.at <= Date.now())).toBe(true)
            expect(text(yield* until(entriesOf(journal, "b", { limit: 10 }), (es) => text(es)[4] === "b8"))).toEqual(["b4", "b5", "b6", "b7", "b8"])
            expect(text(yield* entriesOf(journal, "a", { limit: 2 }))).toEqual(["a7", "a8"])
            expect(text(yield* entriesOf(journal, "a", { limit: 2, before: 13 }))).toEqual(["a5", "a6"])
            expect(text(yield* entriesOf(journal, "a", { limit: 10, before: 9 }))).toEqual(["a4"])
            expect(yield* entriesOf(journal, "never", { limit: 10 })).toEqual([])
            // Opening again finds the same journal.
            const again = yield* (yield* Journal).open(spec("history"))
            expect(text(yield* entriesOf(again, "a", { limit: 1 }))).toEqual(["a8"])
            expect(yield* again.nextSeq).toBe(17)
          })
        ))

      it.scoped("keeps only the newest entries of all keys that fit in maxBytes", () =>
        withBus(
          Effect.gen(function*() {
            const journal = yield* (yield* Journal).open(spec("history", { maxMessagesPerKey: 1_000, maxBytes: 4_000 }))
            const entry = (i: number) => `${String(i).padStart(3, "0")}${"x".repeat(97)}`
            for (let i = 1; i <= 50; i++) journal.append(i % 2 === 0 ? "even" : "odd", entry(i))
            const kept = yield* until(
              Effect.zipWith(entriesOf(journal, "odd", { limit: 1_000 }), entriesOf(journal, "even", { limit: 1_000 }), (odd, even) =>
                [...odd, ...even].sort((x, y) => x.seq - y.seq)),
              (es) => es.length > 0 && text(es)[es.length - 1] === entry(50)
            )
            // 100 bytes each: at most 40 fit together (fewer where the adapter counts its own
            // overhead, as JetStream does with the subject and each append's message-id header, and
            // the embedded journal with each entry's bookkeeping), and what is kept is the newest
            // run across both keys.
            const bytes = kept.reduce((sum, e) => sum + e.data.byteLength, 0)
            expect(bytes).toBeLessThanOrEqual(4_000)
            expect(kept.length).toBeGreaterThanOrEqual(8)
            expect(text(kept)).toEqual(Array.from({ length: kept.length }, (_, i) => entry(51 - kept.length + i)))
          })
        ))

      it.scoped("reads a page bounded by bytes, newest first, with the cursor to go on; an entry larger than the page comes alone", () =>
        withBus(
          Effect.gen(function*() {
            const journal = yield* (yield* Journal).open(spec("history", { maxMessagesPerKey: 100 }))
            // Sizes 100, 100, 100, 500, 100, 100, 100: a 250-byte page holds two of the small ones.
            const sizes = [100, 100, 100, 500, 100, 100, 100]
            sizes.forEach((size, i) => journal.append("room", `${i}`.padEnd(size, "x")))
            journal.append("other", "y".repeat(1_000))
            yield* until(entriesOf(journal, "room", { limit: 100 }), (es) => es.length === sizes.length)
            const pages: Array<ReadonlyArray<string>> = []
            let before: number | undefined
            for (let more = true; more && pages.length < 20;) {
              const page = yield* journal.read("room", { limit: 100, maxBytes: 250, ...(before === undefined ? {} : { before }) })
              pages.push(text(page.entries).map((t) => t[0]!))
              more = page.more
              before = page.entries[0]?.seq
            }
            expect(pages).toEqual([["5", "6"], ["4"], ["3"], ["1", "2"], ["0"]])
            // The count limit still applies, and says there is more too.
            const two = yield* journal.read("room", { limit: 2 })
            expect([text(two.entries).map((t) => t[0]), two.more]).toEqual([["5", "6"], true])
            expect((yield* journal.read("room", { limit: 100 })).more).toBe(false)
            expect(yield* journal.read("never", { limit: 10, maxBytes: 10 })).toEqual({ entries: [], more: false })
          })
        ))

      it.scoped("follows a key from a sequence: what was stored since, then each new entry, in order", () =>
        withBus(
          Effect.gen(function*() {
            const journal = yield* (yield* Journal).open(spec("history", { maxMessagesPerKey: 100 }))
            journal.append("room", "before")
            journal.append("other", "elsewhere")
            yield* until(entriesOf(journal, "room", { limit: 10 }), (es) => es.length === 1)
            const from = yield* journal.nextSeq
            journal.append("room", "r1")
            journal.append("other", "not followed")
            journal.append("room", "r2")
            yield* until(entriesOf(journal, "room", { limit: 10 }), (es) => es.length === 3)
            const replayed = yield* Queue.unbounded<string>()
            yield* journal.follow("room", { from }, (e) => void Queue.unsafeOffer(replayed, new TextDecoder().decode(e.data)))
            // A follower that starts now hears only what is appended from here on.
            const fresh = yield* Queue.unbounded<string>()
            yield* journal.follow("room", {}, (e) => void Queue.unsafeOffer(fresh, new TextDecoder().decode(e.data)))
            journal.append("room", "r3")
            const takeAll = (q: Queue.Queue<string>, n: number) =>
              Effect.forEach(Array.from({ length: n }), () => Queue.take(q)).pipe(Effect.timeout("5 seconds"))
            expect(yield* takeAll(replayed, 3)).toEqual(["r1", "r2", "r3"])
            expect(yield* takeAll(fresh, 1)).toEqual(["r3"])
            expect(yield* Queue.size(fresh)).toBe(0)
          })
        ))
    })
  })
}
