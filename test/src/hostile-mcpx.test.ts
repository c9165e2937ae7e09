/**
 * MCPx v0.1 against one hostile client (issue 12, "Hardening first"): each attack gets the spec's
 * error or a refusal at once, costs the gateway bounded memory, and leaves everyone else, the
 * attacker's own socket and the topic's history working. On the embedded bus, where these are
 * about the broker's logic.
 */
import { describe, expect, it } from "@effect/vitest"
import { Broker } from "@switchboard/broker"
import { Journal, Kv, Subjects } from "@switchboard/bus"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Stream from "effect/Stream"
import { closedWith } from "./support/Client.ts"
import {
  barrier,
  deepEnvelope,
  delivered,
  type Envelope,
  GATEWAY,
  gatewayError,
  join,
  open,
  type Participant,
  PROTOCOL,
  roster
} from "./support/Participants.ts"
import { serve, token } from "./support/Stack.ts"

/** Edge, auth and broker on the embedded bus, and the bus's KV and journals to look into. */
const start = (env: Record<string, string> = {}) =>
  Effect.map(serve(Broker.layer, env), ({ ctx, url, ws }) => ({ http: url, ws, kv: Context.get(ctx, Kv.Kv), journal: Context.get(ctx, Journal.Journal) }))

/** An HTTP call through the edge, and how long its answer took. */
const api = (url: string, method: string, bearer: string) =>
  Effect.promise(async () => {
    const started = performance.now()
    const res = await fetch(url, { method, headers: { authorization: `Bearer ${bearer}` }, signal: AbortSignal.timeout(20_000) })
    const text = await res.text()
    return { status: res.status, text, millis: performance.now() - started }
  })

/** A topic's history as a reader allowed to see it gets it. */
const historyOf = (http: string, topic: string) =>
  Effect.gen(function*() {
    const reader = yield* token({ sub: "reader", topics: [topic] })
    const page = yield* api(`${http}/v0/topics/${encodeURIComponent(topic)}/history?limit=1000`, "GET", reader)
    return { ...page, envelopes: page.status === 200 ? (JSON.parse(page.text) as { readonly envelopes: ReadonlyArray<Envelope> }).envelopes : [] }
  })

const allReceive = (participants: ReadonlyArray<Participant>, sent: ReturnType<Participant["send"]>) =>
  Effect.forEach(participants, (p) => Effect.map(p.next(), (e) => expect(e).toEqual(delivered(sent))), { discard: true })

const toolCall = { jsonrpc: "2.0", id: 1, method: "tools/call", params: { name: "deploy" } }

/** Within the envelope limit (64 KiB) and deep enough to overflow any recursive encoder. */
const DEEP = 20_000

describe("hostile MCPx: deep nesting", () => {
  it.scopedLive("refuses an envelope nested deeper than 64 levels with invalid_envelope, and the topic's history stays readable", () =>
    Effect.gen(function*() {
      const { http, ws } = yield* start()
      const alice = yield* join(ws, "deep", { id: "alice", privilege: "full" })
      const bob = yield* join(ws, "deep", { id: "bob", privilege: "full" })
      const before = alice.send({ kind: "chat", payload: { text: "before" } })
      yield* allReceive([alice, bob], before)

      // With a ts, so it would have travelled and been stored exactly as sent.
      alice.sendRaw(deepEnvelope("alice", DEEP, { ts: "2025-08-26T14:00:00Z" }))
      expect(yield* alice.nextAny).toEqual(gatewayError("alice", "invalid_envelope", undefined, /nested deeper than 64/))
      const after = yield* barrier(alice, [alice, bob])

      const page = yield* historyOf(http, "deep")
      expect(page.status).toBe(200)
      expect(page.millis).toBeLessThan(3_000)
      expect(page.envelopes.map((e) => e.id)).toEqual([before.id, after.id])
    }))

  it.scopedLive("skips a stored history entry it cannot decode instead of failing the read", () =>
    Effect.gen(function*() {
      const { http, journal } = yield* start()
      // An entry stored before depth was limited, written straight into the topic's history.
      const log = yield* journal.open({ name: Subjects.JournalName.history, maxMessagesPerKey: 100, maxAge: "1 hour", maxBytes: 1 << 20, retryFor: "1 minute" })
      const good = (text: string) => ({ protocol: PROTOCOL, id: text, ts: "2025-08-26T14:00:00Z", from: "alice", kind: "chat", payload: { text } })
      const key = Subjects.historyKey("poisoned")
      log.append(key, JSON.stringify(good("first")))
      log.append(key, deepEnvelope("mallory", 100_000))
      log.append(key, JSON.stringify(good("last")))

      const page = yield* historyOf(http, "poisoned")
      expect(page.status).toBe(200)
      expect(page.millis).toBeLessThan(3_000)
      expect(page.envelopes).toEqual([good("first"), good("last")])
    }))

  it.scopedLive("refuses a deep envelope without ts with invalid_envelope; the socket stays open and the next envelope is delivered", () =>
    Effect.gen(function*() {
      const { ws } = yield* start()
      const alice = yield* join(ws, "stamp", { id: "alice", privilege: "full" })
      const bob = yield* join(ws, "stamp", { id: "bob", privilege: "full" })
      // Without a ts the gateway re-encodes the envelope to stamp one: that is where it used to vanish.
      alice.sendRaw(deepEnvelope("alice", DEEP))
      expect(yield* alice.next()).toEqual(gatewayError("alice", "invalid_envelope", undefined, /nested deeper than 64/))
      yield* allReceive([alice, bob], alice.send({ kind: "chat", payload: { text: "still here" } }))
    }))
})

describe("hostile MCPx: malformed percent escapes", () => {
  it.scopedLive("answers a malformed % escape in an API path with 400 at once", () =>
    Effect.gen(function*() {
      const { http } = yield* start()
      const viewer = yield* token({ sub: "viewer" })
      const admin = yield* token({ sub: "root", admin: true })
      const cases = [
        ["GET", "/v0/topics/%E0%A4%A/participants", viewer],
        ["GET", "/v0/topics/%E0%A4%A/history", viewer],
        ["POST", "/admin/participants/%zz/promote", admin]
      ] as const
      for (const [method, path, bearer] of cases) {
        const answer = yield* api(`${http}${path}`, method, bearer)
        expect({ path, status: answer.status }).toEqual({ path, status: 400 })
        expect(JSON.parse(answer.text)).toEqual({ error: expect.stringMatching(/malformed percent-encoding/) })
        expect(answer.millis).toBeLessThan(2_000)
      }
    }))
})

describe("hostile MCPx: history memory", () => {
  it.scopedLive("keeps each topic's newest MCPX_HISTORY_LIMIT envelopes and all of them within MCPX_HISTORY_TOTAL_BYTES, oldest dropped first", () =>
    Effect.gen(function*() {
      const { http, ws } = yield* start({ MCPX_HISTORY_LIMIT: "12", MCPX_HISTORY_TOTAL_BYTES: "20000" })
      /** Sends `count` chats of about a kilobyte each to `topic`, and waits until they are in. */
      const fill = (topic: string, count: number) =>
        Effect.gen(function*() {
          const p = yield* join(ws, topic, { id: "alice", privilege: "full" })
          const sent = Array.from({ length: count }, (_, i) => p.send({ kind: "chat", payload: { text: `${i}`.padEnd(900, ".") } }))
          // The sequencer stores each envelope as it sends it out, so the echo means it is stored.
          yield* p.collect(count, "chat")
          return sent.map((e) => e.id)
        })
      const older = yield* fill("older", 10)
      const newer = yield* fill("newer", 15)
      const a = yield* historyOf(http, "older")
      const b = yield* historyOf(http, "newer")
      const bytes = (es: ReadonlyArray<Envelope>) => es.reduce((sum, e) => sum + Buffer.byteLength(JSON.stringify(e)), 0)

      // Each keeps its newest run; the newer topic is cut by its own count, the older one by the total.
      expect(b.envelopes.map((e) => e.id)).toEqual(newer.slice(newer.length - b.envelopes.length))
      expect(b.envelopes.length).toBe(12)
      expect(a.envelopes.map((e) => e.id)).toEqual(older.slice(older.length - a.envelopes.length))
      expect(a.envelopes.length).toBeLessThan(10)
      expect(bytes(a.envelopes) + bytes(b.envelopes)).toBeLessThanOrEqual(20_000)
    }))

  it.scopedLive("lets go of a topic empty for MCPX_TOPIC_IDLE (its claim in KV goes), and sets it up again for the next participant", () =>
    Effect.gen(function*() {
      const { http, kv, ws } = yield* start({ MCPX_TOPIC_IDLE: "200 millis" })
      const claims = yield* kv.bucket(Subjects.Bucket.topics)
      const key = Subjects.Key.topic("quiet")
      const alice = yield* join(ws, "quiet", { id: "alice", privilege: "full" })
      expect(Option.isSome(yield* claims.get(key))).toBe(true)
      const released = yield* claims.watch({ key }).pipe(
        Stream.filter((e) => e.operation !== "PUT"),
        Stream.runHead,
        Effect.fork
      )
      const first = alice.send({ kind: "chat", payload: { text: "anyone?" } })
      yield* allReceive([alice], first)
      yield* alice.leave
      yield* Fiber.join(released).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("the topic's claim was kept") }))

      // A new participant finds the topic as new, and its history as it was.
      const bob = yield* join(ws, "quiet", { id: "bob", privilege: "full" })
      expect(roster(bob)).toEqual([{ id: "bob", privilege: "full" }])
      const second = bob.send({ kind: "chat", payload: { text: "me" } })
      yield* allReceive([bob], second)
      expect(Option.isSome(yield* claims.get(key))).toBe(true)
      const carol = yield* join(ws, "quiet", { id: "carol", privilege: "full" })
      expect(roster(carol).map((m) => m.id)).toEqual(["bob", "carol"])
      expect(yield* bob.nextAny).toMatchObject({ from: GATEWAY, kind: "presence", payload: { event: "join", participant: { id: "carol" } } })
      yield* barrier(carol, [bob, carol])
      expect((yield* historyOf(http, "quiet")).envelopes.map((e) => e.id).slice(0, 2)).toEqual([first.id, second.id])
    }))
})

describe("hostile MCPx: duplicate-id memory", () => {
  it.scopedLive("counts only accepted envelopes' ids as used", () =>
    Effect.gen(function*() {
      const { ws } = yield* start()
      const human = yield* join(ws, "ids", { id: "human", privilege: "full" })
      const agent = yield* join(ws, "ids", { id: "agent" })
      agent.send({ id: "reused", kind: "mcp", payload: toolCall })
      expect(yield* agent.next("mcp")).toMatchObject({ correlation_id: "reused", payload: { error: { code: -32001 } } })
      agent.send({ id: "also-reused", kind: "system", payload: { event: "welcome" } })
      expect(yield* agent.next()).toEqual(gatewayError("agent", "forbidden_kind", "also-reused"))
      // Refused, so the ids are still free.
      yield* allReceive([human, agent], agent.send({ id: "reused", kind: "chat", payload: { text: "now accepted" } }))
      yield* allReceive([human, agent], agent.send({ id: "also-reused", kind: "mcp/proposal", payload: { method: "tools/list", params: {} } }))
    }))

  it.scopedLive("refuses an envelope id over 256 characters with invalid_envelope", () =>
    Effect.gen(function*() {
      const { ws } = yield* start()
      const alice = yield* join(ws, "long-ids", { id: "alice", privilege: "full" })
      alice.send({ id: "x".repeat(257), kind: "chat", payload: { text: "long" } })
      expect(yield* alice.next()).toEqual(gatewayError("alice", "invalid_envelope", undefined, /256/))
      yield* allReceive([alice], alice.send({ id: "x".repeat(256), kind: "chat", payload: { text: "just fits" } }))
    }))

  it.scopedLive("remembers at most 512 Ki characters of ids per participant, forgetting the oldest", () =>
    Effect.gen(function*() {
      const { ws } = yield* start({ MCPX_RATE: "100000", MCPX_BURST: "100000", MCPX_CHAT_RATE: "100000", MCPX_CHAT_BURST: "100000" })
      const alice = yield* join(ws, "many-ids", { id: "alice", privilege: "full" })
      // 2,050 ids of 256 characters are more than 512 Ki characters, though far fewer than 10,000 ids.
      const id = (i: number) => String(i).padStart(256, "0")
      for (let i = 0; i < 2_050; i++) alice.send({ id: id(i), kind: "chat", payload: { text: "" } })
      yield* alice.collect(2_050, "chat")
      yield* allReceive([alice], alice.send({ id: id(0), kind: "chat", payload: { text: "forgotten, so new" } }))
      alice.send({ id: id(2_049), kind: "chat", payload: { text: "still remembered" } })
      expect(yield* alice.next()).toEqual(gatewayError("alice", "duplicate_id", id(2_049)))
    }))
})

describe("hostile MCPx: speaking as the gateway", () => {
  it.scopedLive("refuses a participant id in the system: namespace at open with 1008; nobody hears of it", () =>
    Effect.gen(function*() {
      const { ws } = yield* start()
      const alice = yield* join(ws, "lobby", { id: "alice", privilege: "full" })
      for (const id of [GATEWAY, "system:anything"]) {
        const impostor = yield* open(ws, "lobby", { id, privilege: "full" })
        expect(yield* closedWith(impostor)).toEqual({ code: 1008, reason: expect.stringMatching(/reserved/) })
        expect(yield* Queue.size(impostor.messages)).toBe(0)
      }
      yield* barrier(alice, [alice])
    }))

  it.scopedLive("refuses presence joins and leaves from a participant with forbidden_kind; its own status still passes", () =>
    Effect.gen(function*() {
      const { ws } = yield* start()
      const alice = yield* join(ws, "presence", { id: "alice", privilege: "full" })
      const mallory = yield* join(ws, "presence", { id: "mallory", privilege: "full" })
      for (const event of ["join", "leave"]) {
        const forged = mallory.send({ kind: "presence", payload: { event, participant: { id: "alice", privilege: "full" } } })
        expect(yield* mallory.nextAny).toEqual(gatewayError("mallory", "forbidden_kind", forged.id))
      }
      const status = mallory.send({ kind: "presence", payload: { event: "status", status: "busy" } })
      // Alice saw mallory's real join, then the status: nothing forged came between.
      expect(yield* alice.nextAny).toMatchObject({ from: GATEWAY, kind: "presence", payload: { event: "join", participant: { id: "mallory" } } })
      expect(yield* alice.nextAny).toEqual(delivered(status))
      expect(yield* mallory.nextAny).toEqual(delivered(status))
    }))
})

describe("hostile MCPx: oversized names", () => {
  it.scopedLive("refuses a topic name or participant id over 256 characters at open with 1008", () =>
    Effect.gen(function*() {
      const { ws } = yield* start()
      const longTopic = yield* open(ws, "t".repeat(257), { id: "alice", privilege: "full" })
      expect(yield* closedWith(longTopic)).toEqual({ code: 1008, reason: expect.stringMatching(/256/) })
      const longId = yield* open(ws, "names", { id: "a".repeat(257), privilege: "full" })
      expect(yield* closedWith(longId)).toEqual({ code: 1008, reason: expect.stringMatching(/256/) })
      const fits = yield* join(ws, "t".repeat(256), { id: "a".repeat(256), privilege: "full" })
      yield* barrier(fits, [fits])
    }))
})
