/**
 * A history page is bounded by bytes as well as by count (issue 26): a client that asks for a
 * thousand envelopes of 60 KB gets what fits in MCPX_HISTORY_PAGE_BYTES and the cursor to go on,
 * a page's answer fits through a NATS server's default max_payload, and the reads one process runs
 * at once are bounded, so concurrent big reads cannot take the process's memory.
 */
import { describe, expect, it } from "@effect/vitest"
import { Broker } from "@switchboard/broker"
import { Edge } from "@switchboard/edge"
import { NatsServer } from "@switchboard/testing"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Inspector from "./support/Inspector.ts"
import { join } from "./support/Participants.ts"
import * as Processes from "./support/Processes.ts"
import { MiB, mib, peakRss, rssOf } from "./support/Rss.ts"
import { busLayer, namespace, serve, stack, token } from "./support/Stack.ts"

const KiB = 1024

interface Page {
  readonly status: number
  readonly retryAfter: string | null
  readonly envelopes: ReadonlyArray<{ readonly id: string }>
  readonly before: number | null
  readonly more: unknown
  readonly error?: string
  /** What the envelopes take as JSON, each on its own. */
  readonly bytes: number
}

/** One history page as a reader of `topic` gets it. */
const page = (http: string, topic: string, query: string) =>
  Effect.gen(function*() {
    const reader = yield* token({ sub: "reader", topics: [topic] })
    return yield* Effect.promise(async (): Promise<Page> => {
      const res = await fetch(`${http}/v0/topics/${topic}/history?${query}`, {
        headers: { authorization: `Bearer ${reader}` },
        signal: AbortSignal.timeout(60_000)
      })
      const text = await res.text()
      // The edge's own refusals (504 when the service did not answer, say) are plain text.
      const body = (res.headers.get("content-type")?.startsWith("application/json") === true
        ? JSON.parse(text)
        : { envelopes: [], before: null, more: undefined, error: text }) as Omit<Page, "status" | "bytes" | "retryAfter">
      const envelopes = body.envelopes ?? []
      return {
        ...body,
        envelopes,
        status: res.status,
        retryAfter: res.headers.get("retry-after"),
        bytes: envelopes.reduce((sum, e) => sum + Buffer.byteLength(JSON.stringify(e)), 0)
      }
    })
  })

/** Sends `count` chats of about `size` bytes each to `topic` as one participant, and waits until all are stored. */
const fill = (ws: string, topic: string, count: number, size: number) =>
  Effect.gen(function*() {
    const p = yield* join(ws, topic, { id: "writer", privilege: "full" })
    const ids: Array<string> = []
    // In batches, so a slow machine's socket never holds much more than a batch.
    for (let from = 0; from < count; from += 50) {
      const batch = Math.min(50, count - from)
      for (let i = 0; i < batch; i++) ids.push(p.send({ kind: "chat", payload: { text: `${from + i} `.padEnd(size, "x") } }).id)
      // The sequencer stores each envelope as it sends it out, so the echo means it is stored.
      yield* p.collect(batch, "chat")
    }
    yield* p.leave
    return ids
  })

/** Every page of `topic`, newest page first, following `before` while the answer says there is more. */
const allPages = (http: string, topic: string, limit: number) =>
  Effect.gen(function*() {
    const pages: Array<Page> = []
    let query = `limit=${limit}`
    for (;;) {
      const p = yield* page(http, topic, query)
      expect(p.status).toBe(200)
      pages.push(p)
      if (p.more !== true || pages.length > 1_000) return pages
      query = `limit=${limit}&before=${p.before}`
    }
  })

/** Envelopes per second well above what these tests send, so the rate limit is not what they measure. */
const FAST = { MCPX_RATE: "100000", MCPX_BURST: "100000", MCPX_CHAT_RATE: "100000", MCPX_CHAT_BURST: "100000" }

describe("MCPx history pages: bounded by bytes", () => {
  it.scopedLive("a page holds at most MCPX_HISTORY_PAGE_BYTES, says there is more, and following `before` gets every envelope once", () =>
    Effect.gen(function*() {
      const pageBytes = 64 * KiB
      const { url, ws } = yield* serve(Broker.layer, { ...FAST, MCPX_HISTORY_PAGE_BYTES: String(pageBytes) })
      const sent = yield* fill(ws, "big", 200, 6_000)
      const pages = yield* allPages(url, "big", 1_000)

      for (const p of pages) expect(p.bytes).toBeLessThanOrEqual(pageBytes)
      // About ten 6 KB envelopes a page: never a thousand, never one.
      expect(pages[0]!.envelopes.length).toBeGreaterThan(5)
      expect(pages[0]!.envelopes.length).toBeLessThan(12)
      expect(pages.slice(0, -1).every((p) => p.more === true)).toBe(true)
      expect(pages[pages.length - 1]!.more).toBe(false)
      // Newest page first, oldest envelope first within a page: reversed pages are the topic's order.
      const read = pages.reverse().flatMap((p) => p.envelopes.map((e) => e.id))
      expect(read).toEqual(sent)
    }))

  it.scopedLive("an envelope larger than the page comes alone, so reading always makes progress", () =>
    Effect.gen(function*() {
      const { url, ws } = yield* serve(Broker.layer, { ...FAST, MCPX_HISTORY_PAGE_BYTES: "1000" })
      const sent = yield* fill(ws, "huge", 3, 5_000)
      const pages = yield* allPages(url, "huge", 1_000)
      expect(pages.map((p) => p.envelopes.map((e) => e.id))).toEqual([[sent[2]], [sent[1]], [sent[0]]])
      expect(pages.map((p) => p.more)).toEqual([true, true, false])
    }))

  it.scopedLive("a page answer fits a NATS server's default max_payload (1 MiB): 40 envelopes of 60 KB, default settings", () =>
    Effect.gen(function*() {
      const { servers } = yield* NatsServer
      const ctx = yield* Layer.build(stack(busLayer(servers, namespace()), { services: Broker.layer, env: FAST }))
      const http = (ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape).url
      const ws = http.replace("http", "ws")
      const sent = yield* fill(ws, "wide", 40, 60_000)
      const first = yield* page(http, "wide", "limit=1000")
      expect(first.status).toBe(200)
      expect(first.bytes).toBeLessThanOrEqual(512 * KiB)
      expect(first.more).toBe(true)
      const pages = yield* allPages(http, "wide", 1_000)
      expect(pages.reverse().flatMap((p) => p.envelopes.map((e) => e.id))).toEqual(sent)
      // Scoped inside the server's layer: the stack closes while its NATS server still runs. Closed
      // after the server had stopped, it took some 40 s to give up on it, in this test and the next.
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)
})

describe("MCPx history pages: reads at once", () => {
  it.scopedLive("past MCPX_HISTORY_READS running and MCPX_HISTORY_READS_WAITING waiting, a read is answered 503 with Retry-After", () =>
    Effect.gen(function*() {
      // On NATS, where a read waits for JetStream and so reads overlap; on the embedded bus a
      // page is read in one go, and no two ever run at once.
      const { servers } = yield* NatsServer
      const env = { ...FAST, MCPX_HISTORY_READS: "1", MCPX_HISTORY_READS_WAITING: "0" }
      const ctx = yield* Layer.build(stack(busLayer(servers, namespace()), { services: Broker.layer, env }))
      const http = (ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape).url
      yield* fill(http.replace("http", "ws"), "busy", 20, 60_000)
      // Twenty at once: one runs, none may wait, so the others are turned away.
      const answers = yield* Effect.all(Array.from({ length: 20 }, () => page(http, "busy", "limit=1000")), { concurrency: "unbounded" })
      const refused = answers.filter((a) => a.status === 503)
      expect(answers.map((a) => a.status).filter((s) => s !== 200 && s !== 503)).toEqual([])
      expect(answers.some((a) => a.status === 200)).toBe(true)
      expect(refused.length).toBeGreaterThan(0)
      for (const a of refused) {
        expect(a.retryAfter).toBe("1")
        expect(a.error).toMatch(/too many history reads/)
      }
      // Once the others are done, the same read succeeds.
      expect((yield* page(http, "busy", "limit=1000")).status).toBe(200)
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)

  it.scopedLive("eight concurrent reads of 500 envelopes of 60 KB keep npm start's RSS bounded", () =>
    Effect.gen(function*() {
      const proc = yield* Processes.allInOne({ namespace: namespace(), nodeArgs: ["--inspect=127.0.0.1:0"], env: FAST })
      const inspector = yield* Inspector.attach(proc)
      yield* fill(proc.ws, "heavy", 500, 60_000)
      const heapBefore = yield* inspector.heapAfterGc
      const rssBefore = rssOf(proc.pid)
      // A sampler, not a synchronisation: the peak is what the reads cost while they ran.
      const rss = yield* peakRss(proc.pid)
      const answers = yield* Effect.all(Array.from({ length: 8 }, () => page(proc.url, "heavy", "limit=1000")), { concurrency: "unbounded" })
      yield* rss.stop
      const peak = rss.peak()
      const heapAfter = yield* inspector.heapAfterGc
      const rssAfter = rssOf(proc.pid)
      console.log(
        `8 concurrent history reads: RSS ${mib(rssBefore)} → peak ${mib(peak)} → ${mib(rssAfter)} MiB after GC; heap after GC ${mib(heapBefore)} → ${mib(heapAfter)} MiB; pages of ${answers.map((a) => a.envelopes.length).join(", ")} envelopes`
      )
      expect(answers.every((a) => a.status === 200 && a.envelopes.length > 0)).toBe(true)
      expect(peak - rssBefore).toBeLessThan(96 * MiB)
    }), 180_000)
})
