/**
 * The NATS connection as the adapters get it, against a real server that starts without JetStream
 * and is restarted with it: a JetStream manager that could not be made is made again once JetStream
 * is there, the reconnect is told to the listeners whose scope is open (and to no other), and the
 * connection's troubles are logged as they come.
 */
import { describe, expect, it } from "@effect/vitest"
import { NatsLateJetStream } from "@switchboard/testing"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Logger from "effect/Logger"
import * as Queue from "effect/Queue"
import * as Scope from "effect/Scope"
import * as NatsConnection from "../src/NatsConnection.ts"

describe("NatsConnection", () => {
  it.scopedLive("makes its JetStream manager again after JetStream comes, and tells a reconnect to the listeners still listening", () =>
    Effect.gen(function*() {
      const nats = yield* NatsLateJetStream
      const logs = yield* Queue.unbounded<string>()
      const logged = (line: string) =>
        Queue.take(logs).pipe(Effect.repeat({ until: (l) => l === line }), Effect.timeoutFail({ duration: "30 seconds", onTimeout: () => new Error(`not logged within 30 s: ${line}`) }))
      const link = yield* NatsConnection.link({ servers: nats.servers, namespace: `conn${process.pid}` }).pipe(
        Effect.provide(Logger.replace(Logger.defaultLogger, Logger.make(({ message }) => Queue.unsafeOffer(logs, Array.isArray(message) ? message.join(" ") : String(message)))))
      )
      expect(link.isConnected()).toBe(true)
      expect(yield* Effect.either(Effect.tryPromise(link.jsm))).toMatchObject({ _tag: "Left" })

      const gone = yield* Scope.make()
      let heardByGone = 0
      yield* Scope.extend(link.onReconnect(() => void heardByGone++), gone)
      yield* Scope.close(gone, Exit.void)
      const reconnected = yield* Deferred.make<void>()
      yield* link.onReconnect(() => Deferred.unsafeDone(reconnected, Exit.void))

      yield* nats.enableJetStream
      yield* Deferred.await(reconnected).pipe(Effect.timeoutFail({ duration: "30 seconds", onTimeout: () => new Error("no reconnect within 30 s") }))
      // Listeners are told in one turn, so the one whose scope closed would have been told by now.
      expect(heardByGone).toBe(0)
      yield* logged("NATS disconnect")
      yield* logged("NATS reconnect")
      const manager = yield* Effect.tryPromise(link.jsm)
      expect((yield* Effect.promise(() => manager.getAccountInfo())).streams).toBe(0)

      yield* link.drain
      expect(link.isConnected()).toBe(false)
    }).pipe(Effect.provide(NatsLateJetStream.layer)), 90_000)
})
