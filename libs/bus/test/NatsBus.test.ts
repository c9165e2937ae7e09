import { describe, expect, it } from "@effect/vitest"
import { jetstreamManager } from "@nats-io/jetstream"
import { connect } from "@nats-io/transport-node"
import { NatsServer } from "@switchboard/testing"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Scope from "effect/Scope"
import * as Stream from "effect/Stream"
import * as Bus from "../src/Bus.ts"
import * as Kv from "../src/Kv.ts"
import * as NatsBus from "../src/NatsBus.ts"
import { contract } from "./contract.ts"

contract("nats", NatsServer.layer, (namespace) =>
  Layer.unwrapEffect(Effect.map(NatsServer, ({ servers }) => NatsBus.layer({ servers, namespace }))))

describe("nats kv keys", () => {
  // nats-server 2.9 can report one message still pending at the end of a key listing when keys are
  // rewritten during it, and nats.js then waits for an idle heartbeat (5 to 30 s). The adapter
  // must still list every live key promptly.
  it.scopedLive("lists every live key promptly while the keys are being rewritten", () =>
    Effect.gen(function*() {
      const { servers } = yield* NatsServer
      const kv = yield* Effect.map(Layer.build(NatsBus.layer({ servers, namespace: `keys${process.pid}` })), Context.get(Kv.Kv))
      const bucket = yield* kv.bucket({ name: "churn" })
      const keys = Array.from({ length: 2 }, (_, i) => `k.${i}`)
      for (const k of keys) yield* bucket.put(k, "0")
      yield* bucket.put("gone", "x")
      yield* bucket.delete("gone")
      let round = 0
      // Bounded: at most 20,000 rewrites, stopped with the scope.
      yield* Effect.forEach(Array.from({ length: 20_000 }), () => bucket.put(keys[round++ % keys.length]!, String(round)), { discard: true }).pipe(
        Effect.forkScoped
      )
      for (let i = 0; i < 200; i++) {
        const listed = yield* bucket.keys("k.>").pipe(Effect.timeoutFail({ duration: "3 seconds", onTimeout: () => new Error(`listing ${i} took over 3 s`) }))
        expect([...listed].sort()).toEqual([...keys].sort())
      }
      expect((yield* bucket.keys()).includes("gone")).toBe(false)
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)))
})

describe("nats kv watch", () => {
  // nats.js replaces a watch's consumer that died with its NATS node only after two missed 30 s
  // heartbeats; the adapter notices within seconds and fails the watch, for its user to watch again.
  it.scopedLive("fails soon after its consumer is gone, instead of saying nothing for a minute", () =>
    Effect.gen(function*() {
      const { servers } = yield* NatsServer
      const namespace = `watch${process.pid}`
      const kv = yield* Effect.map(Layer.build(NatsBus.layer({ servers, namespace })), Context.get(Kv.Kv))
      const bucket = yield* kv.bucket({ name: "watched" })
      yield* bucket.put("k", "v")
      // The watch has its consumer once it has replayed the put; listing consumers before then can find none.
      const seen = yield* Deferred.make<void>()
      const ended = yield* bucket.watch({ initial: true }).pipe(
        Stream.tap(() => Deferred.succeed(seen, undefined)),
        Stream.runDrain,
        Effect.either,
        Effect.forkScoped
      )
      yield* Deferred.await(seen).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("the watch saw no put within 10 s") }))
      // The watch's consumer goes, as it does with the node that held it.
      const nc = yield* Effect.acquireRelease(Effect.promise(() => connect({ servers: [...servers] })), (c) => Effect.promise(() => c.close()))
      const jsm = yield* Effect.promise(() => jetstreamManager(nc))
      const stream = `KV_${namespace}_watched`
      const consumers = yield* Effect.promise(async () => {
        const names: Array<string> = []
        for await (const c of jsm.consumers.list(stream)) names.push(c.name)
        return names
      })
      expect(consumers).toHaveLength(1)
      const startedAt = Date.now()
      yield* Effect.promise(() => jsm.consumers.delete(stream, consumers[0]!))
      const result = yield* Fiber.join(ended).pipe(Effect.timeoutFail({ duration: "20 seconds", onTimeout: () => new Error("the watch did not fail within 20 s") }))
      expect(Either.isLeft(result) && result.left.message).toMatch(/watch on bucket .*watched: its consumer is gone/)
      expect(Date.now() - startedAt).toBeLessThan(20_000)
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 40_000)
})

describe("nats requests", () => {
  // Requests are answered on one inbox subscription (NatsRequests), with a timer map per timeout.
  it.scopedLive("answers each request in flight with its own answer, whatever its timeout, and ends those left when the connection closes", () =>
    Effect.gen(function*() {
      const { servers } = yield* NatsServer
      const scope = yield* Scope.make()
      const bus = yield* Effect.map(Layer.buildWithScope(NatsBus.layer({ servers, namespace: `requests${process.pid}` }), scope), Context.get(Bus.Bus))
      const arrived = yield* Deferred.make<void>()
      yield* bus.subscribe("echo", (m) => void Effect.runFork(bus.respond(m, `re:${Bus.text(m)}`)))
      yield* bus.subscribe("held", () => void Deferred.unsafeDone(arrived, Effect.void))
      const answers = yield* Effect.forEach(Array.from({ length: 30 }, (_, i) => i), (i) =>
        Effect.map(bus.request("echo", String(i), { timeout: `${1 + (i % 3)} seconds` }), Bus.text), { concurrency: "unbounded" })
      expect(answers).toEqual(Array.from({ length: 30 }, (_, i) => `re:${i}`))
      // A request nobody answers, asked for a minute: the connection's close ends it at once.
      const ended = yield* Deferred.make<Either.Either<Bus.BusMessage, Bus.NoResponders | Bus.RequestTimeout | Bus.BusError>>()
      bus.unsafeRequest("held", "?", { timeout: "60 seconds" }, (result) => void Deferred.unsafeDone(ended, Effect.succeed(result)))
      yield* Deferred.await(arrived).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("the request never arrived") }))
      const startedAt = Date.now()
      yield* Scope.close(scope, Exit.void)
      const result = yield* Deferred.await(ended).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("the request did not end with its connection") }))
      expect(Either.isLeft(result) && result.left._tag).toBe("BusError")
      expect(Either.isLeft(result) && result.left.message).toMatch(/the connection closed/)
      expect(Date.now() - startedAt).toBeLessThan(10_000)
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 40_000)
})
