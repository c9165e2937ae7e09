/**
 * The behaviour every Bus/Kv adapter must have. Each adapter's test file calls `contract` with a
 * way to build a fresh, isolated (namespaced) Bus + Kv for one test.
 */
import { describe, expect, layer } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import * as Stream from "effect/Stream"
import * as Fiber from "effect/Fiber"
import * as Scope from "effect/Scope"
import { Bus, type BusError, type BusMessage, type NoResponders, type RequestOptions, type RequestTimeout, text } from "../src/Bus.ts"
import { Journal, type JournalLog, type JournalSpec, type ReadOptions } from "../src/Journal.ts"
import { Kv } from "../src/Kv.ts"

export type MakeLayer<R> = (namespace: string) => Layer.Layer<Bus | Kv | Journal, unknown, R>

let counter = 0
const uniqueNamespace = () => `t${process.pid}x${Date.now().toString(36)}x${counter++}`

/** Collects what a subscription receives into a queue so tests can wait for events, not time. */
const collect = (subject: string, options?: { readonly queue?: string }) =>
  Effect.gen(function*() {
    const bus = yield* Bus
    const q = yield* Queue.unbounded<BusMessage>()
    yield* bus.subscribe(subject, (m) => void Queue.unsafeOffer(q, m), options)
    return q
  })

const takeN = (q: Queue.Queue<BusMessage>, n: number) =>
  Effect.map(
    Effect.forEach(Array.from({ length: n }), () => Queue.take(q)),
    (ms) => ms
  ).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error(`timed out waiting for ${n} messages`) }))

export const contract = <R, E>(name: string, shared: Layer.Layer<R, E>, makeLayer: MakeLayer<R>) => {
  const withBus = <A, E2>(effect: Effect.Effect<A, E2, Bus | Kv | Journal | Scope.Scope>) =>
    Effect.flatMap(Layer.build(makeLayer(uniqueNamespace())), (ctx) => Effect.provide(effect, ctx))
  const run = layer(shared, { timeout: "120 seconds", excludeTestServices: true })

  describe(`${name} bus contract`, () => {
    run("contract", (it) => {
      it.scoped("delivers to exact subjects with headers intact", () =>
        withBus(
          Effect.gen(function*() {
            const bus = yield* Bus
            const q = yield* collect("a.b")
            yield* bus.publish("a.b", "hello", { "sb-conn": "c1", traceparent: "00-abc-def-01" })
            yield* bus.publish("a.c", "not for me")
            yield* bus.publish("a.b", new Uint8Array([0x7b, 0x7d]))
            const [first, second] = yield* takeN(q, 2)
            expect(text(first!)).toBe("hello")
            expect(first!.subject).toBe("a.b")
            expect(first!.header("sb-conn")).toBe("c1")
            expect(first!.header("traceparent")).toBe("00-abc-def-01")
            expect(first!.header("missing")).toBeUndefined()
            expect(text(second!)).toBe("{}")
            expect(second!.header("sb-conn")).toBeUndefined()
          })
        ))

      it.scoped("reads each header by its whole name; an empty value reads as absent", () =>
        withBus(
          Effect.gen(function*() {
            const bus = yield* Bus
            const q = yield* collect("h")
            // Names that prefix one another, in both orders, and values with spaces and non-ASCII text.
            yield* bus.publish("h", "", { "sb-conns": "c1,c2", "sb-conn": "c3", "sb-reason": "closed: tab gone (Zürich ✓)", "sb-code": "" })
            yield* bus.publish("h", "", { "sb-conn": "c4", "sb-conns": "c5" })
            const [first, second] = yield* takeN(q, 2)
            expect(first!.header("sb-conn")).toBe("c3")
            expect(first!.header("sb-conns")).toBe("c1,c2")
            expect(first!.header("sb-reason")).toBe("closed: tab gone (Zürich ✓)")
            expect(first!.header("sb-code")).toBeUndefined()
            expect(first!.header("sb")).toBeUndefined()
            expect(second!.header("sb-conns")).toBe("c5")
            expect(second!.header("sb-conn")).toBe("c4")
          })
        ))

      it.scoped("matches * to one token and > to the rest", () =>
        withBus(
          Effect.gen(function*() {
            const bus = yield* Bus
            const star = yield* collect("svc.*.open")
            const tail = yield* collect("svc.>")
            for (const s of ["svc.router.open", "svc.router.conn.x", "svc.a.b.open", "other.router.open", "svc"]) {
              yield* bus.publish(s, s)
            }
            yield* bus.publish("svc.end", "end")
            const tails = yield* takeN(tail, 4)
            expect(tails.map(text)).toEqual(["svc.router.open", "svc.router.conn.x", "svc.a.b.open", "end"])
            const stars = yield* takeN(star, 1)
            expect(stars.map(text)).toEqual(["svc.router.open"])
            expect(yield* Queue.size(star)).toBe(0)
          })
        ))

      it.scoped("gives each message to exactly one member of a queue group", () =>
        withBus(
          Effect.gen(function*() {
            const bus = yield* Bus
            const group = yield* Queue.unbounded<readonly [string, BusMessage]>()
            for (const member of ["a", "b"]) {
              yield* bus.subscribe("work", (m) => void Queue.unsafeOffer(group, [member, m]), { queue: "workers" })
            }
            const all = yield* collect("work")
            const n = 200
            for (let i = 0; i < n; i++) yield* bus.publish("work", String(i))
            const everything = yield* takeN(all, n)
            expect(everything.map(text)).toEqual(Array.from({ length: n }, (_, i) => String(i)))
            const shared = yield* Effect.forEach(Array.from({ length: n }), () => Queue.take(group)).pipe(Effect.timeout("10 seconds"))
            expect(new Set(shared.map(([, m]) => text(m))).size).toBe(n)
            expect(shared.filter(([member]) => member === "a").length).toBeGreaterThan(0)
            expect(shared.filter(([member]) => member === "b").length).toBeGreaterThan(0)
            // Nothing was delivered twice: a late duplicate would arrive before this marker.
            yield* bus.publish("work", "end")
            const [, marker] = yield* Queue.take(group).pipe(Effect.timeout("10 seconds"))
            expect(text(marker)).toBe("end")
          })
        ))

      it.scoped("keeps one publisher's order", () =>
        withBus(
          Effect.gen(function*() {
            const bus = yield* Bus
            const q = yield* collect("ordered")
            const n = 5000
            for (let i = 0; i < n; i++) bus.unsafePublish("ordered", String(i))
            const got = yield* takeN(q, n)
            expect(got.map((m) => Number(text(m)))).toEqual(Array.from({ length: n }, (_, i) => i))
          })
        ))

      it.scoped("answers requests, and tells no-responders from timeouts", () =>
        withBus(
          Effect.gen(function*() {
            const bus = yield* Bus
            yield* bus.subscribe("echo", (m) => void Effect.runFork(bus.respond(m, `re:${text(m)}`, { "x-from": "echo" })), { queue: "q" })
            const answer = yield* bus.request("echo", "ping", { headers: { "x-to": "echo" } })
            expect(text(answer)).toBe("re:ping")
            expect(answer.header("x-from")).toBe("echo")

            const none = yield* Effect.either(bus.request("nobody.home", "?", { timeout: "2 seconds" }))
            expect(Either.isLeft(none) && none.left._tag).toBe("NoResponders")

            yield* bus.subscribe("silent", () => undefined)
            const slow = yield* Effect.either(bus.request("silent", "?", { timeout: "200 millis" }))
            expect(Either.isLeft(slow) && slow.left._tag).toBe("RequestTimeout")
          })
        ))

      it.scoped("stops listening on a request's reply subject once the answer is in, the time is up, or the asker is interrupted", () =>
        withBus(
          Effect.gen(function*() {
            const bus = yield* Bus
            const replies = yield* Queue.unbounded<string>()
            yield* bus.subscribe("asked", (m) => {
              if (m.reply !== undefined) Queue.unsafeOffer(replies, m.reply)
              Effect.runFork(bus.respond(m, "answer"))
            })
            for (let i = 0; i < 3; i++) expect(text(yield* bus.request("asked", "?"))).toBe("answer")
            const unanswered = yield* Queue.unbounded<string>()
            yield* bus.subscribe("unanswered", (m) => {
              if (m.reply === undefined) return
              Queue.unsafeOffer(replies, m.reply)
              Queue.unsafeOffer(unanswered, m.reply)
            })
            const slow = yield* Effect.either(bus.request("unanswered", "?", { timeout: "100 millis" }))
            expect(Either.isLeft(slow) && slow.left._tag).toBe("RequestTimeout")
            const asking = yield* Effect.fork(bus.request("unanswered", "?", { timeout: "10 seconds" }))
            // Interrupted once its request has arrived: the timed-out one's and its own.
            yield* Queue.takeN(unanswered, 2)
            yield* Fiber.interrupt(asking)
            // Nobody is left on the inboxes of answered requests: a request to one finds no responders.
            for (const inbox of yield* Queue.takeAll(replies)) {
              const late = yield* Effect.either(bus.request(inbox, "late", { timeout: "1 second" }))
              expect(Either.isLeft(late) && late.left._tag).toBe("NoResponders")
            }
          })
        ))

      it.scoped("answers a request with a callback, called once and never before it returns: answer, no responders, timeout", () =>
        withBus(
          Effect.gen(function*() {
            const bus = yield* Bus
            yield* bus.subscribe("echo", (m) => void Effect.runFork(bus.respond(m, `re:${text(m)}`, { "x-from": "echo" })), { queue: "q" })
            yield* bus.subscribe("silent", () => undefined)
            /** The results of one callback request, in a queue, and whether any came before it returned. */
            const ask = (subject: string, data: string, options?: RequestOptions) =>
              Effect.gen(function*() {
                const results = yield* Queue.unbounded<Either.Either<BusMessage, NoResponders | RequestTimeout | BusError>>()
                let returned = false
                let early = false
                bus.unsafeRequest(subject, data, options, (result) => {
                  if (!returned) early = true
                  Queue.unsafeOffer(results, result)
                })
                returned = true
                const first = yield* Queue.take(results).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error(`no callback for ${subject}`) }))
                return { first, results, early: () => early }
              })

            const answered = yield* ask("echo", "ping", { headers: { "x-to": "echo" } })
            expect(answered.early()).toBe(false)
            expect(Either.isRight(answered.first) && text(answered.first.right)).toBe("re:ping")
            expect(Either.isRight(answered.first) && answered.first.right.header("x-from")).toBe("echo")

            const none = yield* ask("nobody.home", "?", { timeout: "2 seconds" })
            expect(none.early()).toBe(false)
            expect(Either.isLeft(none.first) && none.first.left._tag).toBe("NoResponders")

            const slow = yield* ask("silent", "?", { timeout: "200 millis" })
            expect(slow.early()).toBe(false)
            expect(Either.isLeft(slow.first) && slow.first.left._tag).toBe("RequestTimeout")

            // Once each: a second answer or a late timer would be a second result. The echo's
            // answer was in before the two later requests were asked, and the timeout is past.
            for (const { results } of [answered, none, slow]) expect(yield* Queue.size(results)).toBe(0)
          })
        ))

      it.scoped("a cancelled callback request is never answered, and stops listening on its reply subject", () =>
        withBus(
          Effect.gen(function*() {
            const bus = yield* Bus
            const asked = yield* Queue.unbounded<BusMessage>()
            yield* bus.subscribe("held", (m) => void Queue.unsafeOffer(asked, m))
            let called = 0
            const cancel = bus.unsafeRequest("held", "?", { timeout: "300 millis" }, () => called++)
            const request = yield* Queue.take(asked).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("the request never arrived") }))
            cancel()
            // Answered after the cancel, and past its timeout: neither reaches the callback.
            yield* bus.respond(request, "too late")
            const inbox = request.reply
            expect(inbox).toBeDefined()
            if (inbox !== undefined) {
              const late = yield* Effect.either(bus.request(inbox, "late", { timeout: "1 second" }))
              expect(Either.isLeft(late) && late.left._tag).toBe("NoResponders")
            }
            // A request that times out after the cancelled one's timer would have fired: by then
            // the cancelled one's timer is past too.
            yield* bus.subscribe("silent", () => undefined)
            const after = yield* Effect.either(bus.request("silent", "?", { timeout: "600 millis" }))
            expect(Either.isLeft(after) && after.left._tag).toBe("RequestTimeout")
            expect(called).toBe(0)
          })
        ))

      it.scoped("streams a subscription and stops it with the scope", () =>
        withBus(
          Effect.gen(function*() {
            const bus = yield* Bus
            const fiber = yield* bus.stream("s.x").pipe(Stream.take(3), Stream.runCollect, Effect.fork)
            // The stream subscribes asynchronously; publish until it has taken three.
            yield* bus.publish("s.x", "tick").pipe(Effect.repeat({ until: () => false, schedule: Schedule.spaced("20 millis") }), Effect.fork)
            const got = yield* Fiber.join(fiber).pipe(Effect.timeout("10 seconds"))
            expect(Chunk.toReadonlyArray(got).map(text)).toEqual(["tick", "tick", "tick"])
          })
        ))

      it.scoped("refuses to publish after drain", () =>
        withBus(
          Effect.gen(function*() {
            const bus = yield* Bus
            expect(bus.isConnected()).toBe(true)
            yield* bus.drain
            expect(bus.isConnected()).toBe(false)
            const after = yield* Effect.either(bus.publish("x", "y"))
            expect(Either.isLeft(after) && after.left._tag).toBe("BusError")
            yield* bus.drain
          })
        ))
    })
  })

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
