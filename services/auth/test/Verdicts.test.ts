/**
 * The kept verdicts: keyed by a digest, bounded by count and by bytes, oldest out first, expired
 * ones dropped; and the auth client on the embedded bus, with an auth service that counts what it
 * is asked, keeping a good user's verdict through a flood of garbage tokens.
 */
import { describe, expect, it } from "@effect/vitest"
import { MemoryBus, Peer, Subjects } from "@switchboard/bus"
import { Auth } from "@switchboard/protocol"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import { randomBytes } from "node:crypto"
import * as AuthClient from "../src/AuthClient.ts"
import * as Verdicts from "../src/Verdicts.ts"

/** A clock the test moves. */
const clock = () => {
  let t = 1_000_000
  return { now: () => t, advance: (ms: number) => void (t += ms) }
}

const table = (limits: Partial<Verdicts.Limits>, c = clock()) =>
  new Verdicts.Verdicts<string>({ keepFor: 1_000, maxEntries: 100, maxBytes: 1_000_000, ...limits }, (s) => 2 * s.length, c.now)

describe("Verdicts", () => {
  it("keys by a 43-character digest, whatever the token's length", () => {
    const long = "x".repeat(15_000)
    expect(Verdicts.digest(long)).toHaveLength(43)
    expect(Verdicts.digest("a.b.c")).toHaveLength(43)
    expect(Verdicts.digest(long)).toBe(Verdicts.digest("x".repeat(15_000)))
    expect(Verdicts.digest(long)).not.toBe(Verdicts.digest(`${long}y`))
  })

  it("remembers the digests of at most max good tokens, oldest out first", () => {
    const digests = new Verdicts.Digests(2)
    for (const token of ["a.1", "a.2", "a.3"]) digests.keep(token, Verdicts.digest(token))
    expect(digests.size).toBe(2)
    for (const token of ["a.1", "a.2", "a.3", "never.kept"]) expect(digests.of(token)).toBe(Verdicts.digest(token))
    // What it remembers is what it answers: a wrong digest kept for a token comes back for it.
    digests.keep("a.4", "remembered")
    expect(digests.of("a.4")).toBe("remembered")
    expect(digests.of("a.2")).toBe(Verdicts.digest("a.2"))
    expect(digests.size).toBe(2)
  })

  it("holds at most maxEntries, evicting the oldest first", () => {
    const t = table({ maxEntries: 3 })
    for (const k of ["a", "b", "c", "d"]) t.set(k, k)
    expect(t.size).toBe(3)
    expect([t.get("a"), t.get("b"), t.get("c"), t.get("d")]).toEqual([undefined, "b", "c", "d"])
    // Kept again, an entry is the newest: the next eviction takes another.
    t.set("b", "b")
    t.set("e", "e")
    expect([t.get("b"), t.get("c"), t.get("d"), t.get("e")]).toEqual(["b", undefined, "d", "e"])
  })

  it("holds at most maxBytes by its estimate, counting each value's size", () => {
    const entry = Verdicts.ENTRY_BYTES + 2 * 100
    const t = table({ maxBytes: 5 * entry })
    for (let i = 0; i < 50; i++) t.set(`k${i}`, "v".repeat(100))
    expect(t.size).toBe(5)
    expect(t.bytes).toBe(5 * entry)
    expect(t.get("k49")).toBe("v".repeat(100))
    expect(t.get("k44")).toBeUndefined()
    // One big value evicts as many small ones as it needs, not all of them.
    t.set("big", "b".repeat(300))
    expect(t.bytes).toBeLessThanOrEqual(5 * entry)
    expect(t.get("big")).toBeDefined()
    expect(t.get("k49")).toBeDefined()
    // A value bigger than the whole table is not kept, and evicts nothing.
    t.set("huge", "h".repeat(10 * entry))
    expect(t.get("huge")).toBeUndefined()
    expect(t.get("k49")).toBeDefined()
  })

  it("forgets a verdict once it has been kept keepFor, and a sweep drops the expired", () => {
    const c = clock()
    const t = table({ keepFor: 1_000 }, c)
    t.set("old", "1")
    c.advance(600)
    t.set("new", "2")
    c.advance(500)
    expect(t.get("old")).toBeUndefined()
    expect(t.get("new")).toBe("2")
    c.advance(600)
    t.sweep()
    expect(t.size).toBe(0)
    expect(t.bytes).toBe(0)
  })
})

/** An auth service on the bus that accepts tokens starting `good:` and counts every ask. */
const countingAuth = (asked: Map<string, number>) =>
  Layer.scopedDiscard(
    Peer.protocol(Auth.AuthPeer).serve(Subjects.authVerify, (request, reply) => {
      const kind = request.token.startsWith("good:") ? request.token : "garbage"
      asked.set(kind, (asked.get(kind) ?? 0) + 1)
      return kind === "garbage"
        ? reply(request).fail(new Auth.TokenRefused({ reason: "malformed token" }))
        : reply(request).succeed({ sub: request.token.slice(5), exp: Math.floor(Date.now() / 1000) + 3600 })
    }, { queue: Subjects.Queue.auth })
  )

describe("AuthClient", () => {
  it.scopedLive("keeps a good user's verdict through a flood of distinct garbage tokens, and refusals briefly", () =>
    Effect.gen(function*() {
      const asked = new Map<string, number>()
      const ctx = yield* Layer.build(AuthClient.layer.pipe(Layer.provideMerge(countingAuth(asked)), Layer.provideMerge(MemoryBus.layer)))
      const auth = ctx.unsafeMap.get(AuthClient.AuthClient.key) as AuthClient.AuthClientShape

      expect(yield* auth.verify("good:alice")).toMatchObject({ sub: "alice" })
      expect(auth.known("good:alice")).toMatchObject({ sub: "alice" })
      const garbage = randomBytes(5_000).toString("base64url")
      expect((yield* Effect.flip(auth.verify(garbage))).reason).toBe("malformed token")
      expect((yield* Effect.flip(auth.verify(garbage))).reason).toBe("malformed token")
      expect(asked.get("garbage")).toBe(1)
      expect(auth.known(garbage)).toBeUndefined()

      // More distinct garbage than the old table's 10,000 entries, at which it cleared everything;
      // short, so that the flood takes seconds, well within the good verdict's 30.
      const started = Date.now()
      yield* Effect.forEach(
        Array.from({ length: 12_000 }, (_, i) => `garbage-${i}`),
        (t) => Effect.flip(auth.verify(t)),
        { concurrency: 64, discard: true }
      )
      expect(asked.get("garbage")).toBe(12_001)
      expect(Date.now() - started).toBeLessThan(25_000)
      expect(auth.known("good:alice")).toMatchObject({ sub: "alice" })
      expect(yield* auth.verify("good:alice")).toMatchObject({ sub: "alice" })
      expect(asked.get("good:alice")).toBe(1)
    }))
})

describe("AuthClient under concurrent requests", () => {
  it.scopedLive("asks the auth service once for a token that many requests present at once, and gives each its verdict", () =>
    Effect.gen(function*() {
      const asked = new Map<string, number>()
      const ctx = yield* Layer.build(AuthClient.layer.pipe(Layer.provideMerge(countingAuth(asked)), Layer.provideMerge(MemoryBus.layer)))
      const auth = ctx.unsafeMap.get(AuthClient.AuthClient.key) as AuthClient.AuthClientShape
      // 500 requests in flight, as the bench's 50 HTTP clients × 10 keep them, when the token's kept
      // verdict runs out (or on its first use): each asked auth, which then verified it 500 times.
      const verdicts = yield* Effect.forEach(Array.from({ length: 500 }, () => auth.verify("good:carol")), (v) => v, { concurrency: "unbounded" })
      expect(verdicts).toHaveLength(500)
      for (const v of verdicts) expect(v).toMatchObject({ sub: "carol" })
      expect(asked.get("good:carol")).toBe(1)
      // A refusal is shared the same way.
      const refusals = yield* Effect.forEach(Array.from({ length: 50 }, () => Effect.flip(auth.verify("bad"))), (v) => v, { concurrency: "unbounded" })
      for (const r of refusals) expect(r.reason).toBe("malformed token")
      expect(asked.get("garbage")).toBe(1)
    }))

  it.scopedLive("a request that stops waiting leaves the others' shared check running", () =>
    Effect.gen(function*() {
      const asked = new Map<string, number>()
      const ctx = yield* Layer.build(AuthClient.layer.pipe(Layer.provideMerge(countingAuth(asked)), Layer.provideMerge(MemoryBus.layer)))
      const auth = ctx.unsafeMap.get(AuthClient.AuthClient.key) as AuthClient.AuthClientShape
      const got: Array<string> = []
      const cancelFirst = auth.unsafeVerify("good:dave", () => got.push("first"))
      const done = yield* Deferred.make<Exit.Exit<Auth.Claims, AuthClient.AuthFailed | AuthClient.AuthUnavailable>>()
      auth.unsafeVerify("good:dave", (exit) => Deferred.unsafeDone(done, Effect.succeed(exit)))
      cancelFirst()
      const exit = yield* Deferred.await(done)
      expect(Exit.isSuccess(exit) && exit.value.sub).toBe("dave")
      expect(got).toEqual([])
      expect(asked.get("good:dave")).toBe(1)
    }))
})
