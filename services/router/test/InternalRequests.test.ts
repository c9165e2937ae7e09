/** `router.internal` alone, on the embedded bus: another service's request to a user's extension, asked through `InternalClient`. */
import { describe, expect, it } from "@effect/vitest"
import { InternalClient, Kv, Subjects } from "@switchboard/bus"
import { Proxy } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import { extension, nextBut, withRouter } from "./Harness.ts"

/** An extension record whose actor is gone: what a crashed replica leaves behind. */
const leftBehind = (user: string, id: string, connectedAt: number) =>
  Effect.gen(function*() {
    const kv = yield* Kv.Kv
    const records = Kv.typed(yield* Effect.orDie(kv.bucket(Subjects.Bucket.extensions)), Proxy.ExtensionRecord)
    yield* Effect.orDie(records.put(Subjects.Key.userExtension(user, id), { id, name: "Gone", user, conn: `gone-${id}`, edge: "gone-edge", connectedAt }))
  })

describe("internal requests", () => {
  it.live("fail with -32000 when the user's only extension is gone, and skip a gone one for a live one", () =>
    withRouter(Effect.gen(function*() {
      yield* leftBehind("alice", "ext-gone", Date.now())
      expect(yield* Effect.flip(InternalClient.request("alice", "createTab", { url: "https://example.com" }))).toMatchObject({
        _tag: "InternalError",
        code: -32000,
        message: "No browser extension is connected for this user"
      })

      // A live extension connected earlier than the gone one's record: the newest is tried first, and skipped.
      const live = yield* extension("bob")
      yield* leftBehind("bob", "ext-gone", Date.now() + 60_000)
      const pending = yield* Effect.fork(InternalClient.request("bob", "getTabs"))
      const asked = yield* nextBut(live.client)
      expect(asked).toEqual({ jsonrpc: "2.0", id: expect.stringMatching(/^proxy:/), method: "getTabs" })
      yield* live.client.send({ jsonrpc: "2.0", id: asked.id, result: { tabs: [1] } })
      expect(yield* Fiber.join(pending)).toEqual({ tabs: [1] })
    })))

  it.live("fail with -32000 when the extension goes away before it answers", () =>
    withRouter(Effect.gen(function*() {
      const ext = yield* extension("alice")
      const pending = yield* Effect.fork(InternalClient.request("alice", "createTab", { url: "https://example.com" }))
      expect((yield* nextBut(ext.client)).method).toBe("createTab")
      yield* ext.client.close(1001, "going away")
      expect(yield* Effect.flip(Fiber.join(pending))).toMatchObject({ _tag: "InternalError", code: -32000, message: "Extension disconnected" })
    })))

  it.live("fail with -32000 when the extension does not answer in time, and its late answer goes nowhere", () =>
    withRouter(
      Effect.gen(function*() {
        const ext = yield* extension("alice")
        const pending = yield* Effect.fork(InternalClient.request("alice", "createTab"))
        const asked = yield* nextBut(ext.client)
        const timedOut = yield* Effect.flip(Fiber.join(pending))
        expect({ code: timedOut.code, message: timedOut.message }).toEqual({ code: -32000, message: "Request timed out after 300ms" })
        yield* ext.client.send({ jsonrpc: "2.0", id: asked.id, result: { late: true } })
        // The extension's socket carries on: the next request is asked and answered.
        const again = yield* Effect.fork(InternalClient.request("alice", "getTabs"))
        const second = yield* nextBut(ext.client)
        yield* ext.client.send({ jsonrpc: "2.0", id: second.id, result: [] })
        expect(yield* Fiber.join(again)).toEqual([])
      }),
      { ROUTER_INTERNAL_TIMEOUT: "300 millis" }
    ))
})
