/**
 * Which failures of nats.js the KV and journal adapters try again: JetStream unavailable for a
 * while (not enabled yet, no stream leader) always, a timeout only where doing it twice is harmless
 * (opening a bucket or journal), anything else never; and opening waits with one warning, for a
 * bound. The retries run on the test clock.
 */
import { describe, expect, it } from "@effect/vitest"
import { JetStreamApiError } from "@nats-io/jetstream"
import { TimeoutError } from "@nats-io/transport-node"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Logger from "effect/Logger"
import * as TestClock from "effect/TestClock"
import { BusError } from "../src/Bus.ts"
import * as NatsFailures from "../src/NatsFailures.ts"

const notEnabled = Object.assign(new Error("jetstream is not enabled"), { name: "JetStreamNotEnabled" })
const noLeader = new JetStreamApiError({ code: 503, err_code: 10008, description: "JetStream system temporarily unavailable" })
const wrongSequence = new JetStreamApiError({ code: 400, err_code: 10071, description: "wrong last sequence" })
const wrapped = (cause: unknown) => NatsFailures.busError("Kv", "open bucket b")(cause)

/** Fails with each of `failures` in turn, then succeeds; counts its attempts. */
const failingThen = (failures: ReadonlyArray<unknown>) => {
  let attempts = 0
  const effect = Effect.suspend(() => {
    const failure = failures[attempts++]
    return failure === undefined ? Effect.succeed("opened") : Effect.fail(wrapped(failure))
  })
  return { effect, attempts: () => attempts }
}

describe("NatsFailures", () => {
  it("tells JetStream unavailable for now from a timeout and from any other failure, wrapped or not", () => {
    for (const e of [notEnabled, noLeader, wrapped(notEnabled), wrapped(noLeader)]) expect(NatsFailures.isJetStreamUnavailable(e)).toBe(true)
    for (const e of [new TimeoutError(), wrapped(new TimeoutError()), wrongSequence, new Error("boom")]) expect(NatsFailures.isJetStreamUnavailable(e)).toBe(false)
    expect(NatsFailures.isUnavailableOrTimedOut(wrapped(new TimeoutError()))).toBe(true)
    expect(NatsFailures.isUnavailableOrTimedOut(wrapped(noLeader))).toBe(true)
    expect(NatsFailures.isUnavailableOrTimedOut(wrapped(wrongSequence))).toBe(false)
  })

  it("keeps the cause and its message in the BusError", () => {
    const e = wrapped(noLeader)
    expect(e).toBeInstanceOf(BusError)
    expect(e.reason).toBe("Kv")
    expect(e.message).toBe("open bucket b: JetStream system temporarily unavailable")
    expect(e.cause).toBe(noLeader)
  })

  it.effect("opening waits while JetStream is unavailable or times out, with one warning", () =>
    Effect.gen(function*() {
      const warnings: Array<string> = []
      const opening = failingThen([notEnabled, new TimeoutError(), noLeader])
      const fiber = yield* opening.effect.pipe(
        NatsFailures.awaitingJetStream("opening bucket b", "60 seconds"),
        Effect.provide(Logger.replace(Logger.defaultLogger, Logger.make(({ message }) => void warnings.push(String(message))))),
        Effect.fork
      )
      yield* TestClock.adjust("10 seconds")
      expect(yield* Fiber.join(fiber)).toBe("opened")
      expect(opening.attempts()).toBe(4)
      expect(warnings).toEqual(["JetStream is not available yet (opening bucket b); trying again for up to 1m"])
    }))

  it.effect("opening gives up past its bound, and at once on a failure that is not JetStream's", () =>
    Effect.gen(function*() {
      const forever = failingThen(Array.from({ length: 1_000 }, () => notEnabled))
      const fiber = yield* forever.effect.pipe(NatsFailures.awaitingJetStream("opening journal j", "5 seconds"), Effect.flip, Effect.fork)
      yield* TestClock.adjust("4 seconds")
      expect(fiber.unsafePoll()).toBeNull()
      yield* TestClock.adjust("10 seconds")
      expect(NatsFailures.isJetStreamUnavailable(yield* Fiber.join(fiber))).toBe(true)

      const refused = failingThen([wrongSequence])
      expect((yield* Effect.flip(refused.effect.pipe(NatsFailures.awaitingJetStream("opening journal j", "5 seconds")))).cause).toBe(wrongSequence)
      expect(refused.attempts()).toBe(1)
    }))

  it.effect("a write is tried again while JetStream is unavailable, but not after a timeout", () =>
    Effect.gen(function*() {
      const election = failingThen([noLeader, noLeader])
      const fiber = yield* election.effect.pipe(NatsFailures.whileJetStreamUnavailable("10 seconds"), Effect.fork)
      yield* TestClock.adjust("5 seconds")
      expect(yield* Fiber.join(fiber)).toBe("opened")
      expect(election.attempts()).toBe(3)

      const timedOut = failingThen([new TimeoutError()])
      expect((yield* Effect.flip(timedOut.effect.pipe(NatsFailures.whileJetStreamUnavailable("10 seconds"))))).toBeInstanceOf(BusError)
      expect(timedOut.attempts()).toBe(1)
    }))
})
