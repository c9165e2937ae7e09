import { describe, expect, it } from "@effect/vitest"
import { NatsServer } from "@switchboard/testing"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
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
