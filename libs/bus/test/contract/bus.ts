/** The Bus port: delivery, queues, requests, streams and draining. */
import { describe, expect } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import * as Stream from "effect/Stream"
import * as Fiber from "effect/Fiber"
import { Bus, type BusError, type BusMessage, type NoResponders, type RequestOptions, type RequestTimeout, text } from "../../src/Bus.ts"
import { collect, type Harness, takeN } from "./harness.ts"

export const busContract = <R, E>(name: string, { run, withBus }: Harness<R, E>) => {
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
}
