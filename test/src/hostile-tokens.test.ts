/**
 * Refused tokens must not be a way to fill a shared process's memory (issue 26, item 4): every
 * service keeps what auth said of a token for a while, and each refused garbage token used to be
 * kept under its whole text, 10,000 of them. Here `npm start`'s process takes a flood of distinct
 * garbage bearer tokens on `GET /v0/topics` while a good user keeps calling it, and its heap after
 * a forced collection must stay where it was; the good user's verdict must stay cached throughout.
 * Tokens over `EDGE_MAX_TOKEN_BYTES` (15 KB ones, as the probe sent) are refused by the edge itself,
 * before auth or any cache sees them.
 */
import { describe, expect, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import { randomBytes } from "node:crypto"
import * as Http from "node:http"
import * as Inspector from "./support/Inspector.ts"
import * as Processes from "./support/Processes.ts"
import { MiB, mib, rssOf } from "./support/Rss.ts"
import { namespace, token } from "./support/Stack.ts"

/** Under the ~8 KiB cap the edge may put on tokens, so the flood still reaches the services then. */
const TOKEN_CHARS = 7_000
/** Over the edge's cap, as the probe's were. */
const OVERSIZE_BYTES = 15 * 1024
/** The first part of the flood, after which the heap is read: fewer than the 10,000 the old cache cleared at. */
const FIRST = 8_000
const FLOOD = 10_000
const CONCURRENCY = 50
/** What the flood may leave on the heap: the bounded table of refusals and the collector's noise. */
const TOLERANCE = 4 * MiB

/** `GET /v0/topics` with `bearer`, on a kept-alive connection of `agent`: its status and body. */
const answer = (agent: Http.Agent, base: string, bearer: string) =>
  new Promise<{ readonly status: number; readonly body: string }>((resolve, reject) => {
    Http.get(`${base}/v0/topics`, { agent, headers: { authorization: `Bearer ${bearer}` } }, (res) => {
      let body = ""
      res.setEncoding("utf8").on("data", (chunk: string) => (body += chunk))
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }))
    }).on("error", reject)
  })
const status = (agent: Http.Agent, base: string, bearer: string) => answer(agent, base, bearer).then((a) => a.status)

/** `switchboard_token_checks_total{outcome}`: how many times the auth service itself was asked. */
const checks = (metricsBase: string, outcome: "valid" | "invalid") =>
  Effect.promise(() => fetch(`${metricsBase}/metrics`).then((r) => r.text())).pipe(
    Effect.map((text) => Number(new RegExp(`^switchboard_token_checks_total\\{outcome="${outcome}"\\} (\\d+)`, "m").exec(text)?.[1] ?? Number.NaN))
  )

describe("refused tokens", () => {
  it.scopedLive(
    "10,000 distinct 7 KB garbage tokens on GET /v0/topics leave the heap where it was, and a good user's verdict stays cached",
    () =>
      Effect.gen(function*() {
        const proc = yield* Processes.allInOne({ namespace: namespace(), nodeArgs: ["--inspect=127.0.0.1:0"] })
        const inspector = yield* Inspector.attach(proc)
        const metrics = yield* Processes.metricsUrl(proc)
        const agent = new Http.Agent({ keepAlive: true, maxSockets: CONCURRENCY })
        yield* Effect.addFinalizer(() => Effect.sync(() => agent.destroy()))
        const good = yield* token({ sub: `good-${proc.pid}`, admin: true })
        const garbage = () => randomBytes((TOKEN_CHARS * 3) / 4).toString("base64url")

        /** `n` garbage requests, `CONCURRENCY` at a time, each of which must be refused; the good user asks every 100. */
        const flood = (n: number, user: string) =>
          Effect.promise(async () => {
            const wrong: Array<string> = []
            let next = 0
            const worker = async () => {
              while (next < n) {
                const i = next++
                const refused = await status(agent, proc.url, garbage())
                if (refused !== 401) wrong.push(`garbage answered ${refused}`)
                if (i % 100 === 0) {
                  const served = await status(agent, proc.url, user)
                  if (served !== 200) wrong.push(`good user answered ${served}`)
                }
              }
            }
            await Promise.all(Array.from({ length: CONCURRENCY }, worker))
            return wrong
          })

        // Warm-up: the code paths, the good user's verdict, and a first batch of refusals.
        expect(yield* Effect.promise(() => status(agent, proc.url, good))).toBe(200)
        expect(yield* flood(500, good)).toEqual([])
        const heapBefore = yield* inspector.heapAfterGc
        const rssBefore = rssOf(proc.pid)
        const invalidBefore = yield* checks(metrics, "invalid")
        const started = Date.now()

        expect(yield* flood(FIRST, good)).toEqual([])
        const heapMid = yield* inspector.heapAfterGc
        const rssMid = rssOf(proc.pid)
        // A second good user, verified just now, for the rest: its verdict is fresh (kept 30 s) for
        // the whole of the last part, in which the old cache reached its 10,000 and cleared.
        const second = yield* token({ sub: `second-${proc.pid}` })
        expect(yield* Effect.promise(() => status(agent, proc.url, second))).toBe(200)
        const validBefore = yield* checks(metrics, "valid")
        const lastStarted = Date.now()
        expect(yield* flood(FLOOD - FIRST, second)).toEqual([])
        const lastSeconds = (Date.now() - lastStarted) / 1000
        const seconds = (Date.now() - started) / 1000
        const heapAfter = yield* inspector.heapAfterGc
        const rssAfter = rssOf(proc.pid)
        const validAfter = yield* checks(metrics, "valid")
        const invalidAfter = yield* checks(metrics, "invalid")

        console.log(JSON.stringify({
          flood: `${FLOOD} x ${TOKEN_CHARS} chars`,
          seconds,
          lastPartSeconds: lastSeconds,
          heapBeforeMiB: mib(heapBefore),
          heapAfter8000MiB: mib(heapMid),
          heapAfterMiB: mib(heapAfter),
          rssBeforeMiB: mib(rssBefore),
          rssAfter8000MiB: mib(rssMid),
          rssAfterMiB: mib(rssAfter),
          authAskedValid: validAfter - validBefore,
          authAskedInvalid: invalidAfter - invalidBefore
        }))
        // Every garbage token went to auth once: distinct, so none could come from the cache.
        expect(invalidAfter - invalidBefore).toBe(FLOOD)
        expect(heapMid - heapBefore).toBeLessThan(TOLERANCE)
        expect(heapAfter - heapBefore).toBeLessThan(TOLERANCE)
        // A good verdict is kept 30 s: within that, the flood must not have pushed it out.
        expect(lastSeconds).toBeLessThan(25)
        expect(validAfter - validBefore, "the good user's token was asked of auth again during the flood").toBe(0)
      }),
    // On two busy cores the flood has taken over two minutes.
    420_000
  )

  it.scopedLive("10,000 distinct 15 KB tokens are refused 401 at the edge, and leave nothing on the heap", () =>
    Effect.gen(function*() {
      const edge = yield* Processes.allInOne({ namespace: namespace(), nodeArgs: ["--inspect=127.0.0.1:0"] })
      const inspector = yield* Inspector.attach(edge)
      const heapBefore = yield* inspector.heapAfterGc
      const rssBefore = rssOf(edge.pid)

      const agent = new Http.Agent({ keepAlive: true, maxSockets: CONCURRENCY })
      yield* Effect.addFinalizer(() => Effect.sync(() => agent.destroy()))
      const answers = new Map<string, number>()
      yield* Effect.promise(async () => {
        let next = 0
        const worker = async () => {
          while (next < FLOOD) {
            next++
            // Distinct and base64url-shaped, as a forged JWT would be; never the same twice.
            const token = randomBytes((OVERSIZE_BYTES * 3) / 4).toString("base64url")
            const { status, body } = await answer(agent, edge.url, token)
            const key = `${status} ${body.replace(/\d+ bytes/, "N bytes")}`
            answers.set(key, (answers.get(key) ?? 0) + 1)
          }
        }
        await Promise.all(Array.from({ length: CONCURRENCY }, worker))
      })
      const heapAfter = yield* inspector.heapAfterGc
      const rssAfter = rssOf(edge.pid)
      const figures = {
        tokens: FLOOD,
        tokenBytes: OVERSIZE_BYTES,
        heapBeforeMiB: mib(heapBefore),
        heapAfterMiB: mib(heapAfter),
        rssBeforeMiB: mib(rssBefore),
        rssAfterMiB: mib(rssAfter)
      }
      console.log(JSON.stringify({ flood: "oversize tokens", ...figures, answers: Object.fromEntries([...answers].map(([k, n]) => [k.slice(0, 80), n])) }))
      expect([...answers]).toEqual([[`401 ${JSON.stringify({ error: "invalid token: token too long: N bytes, at most 8192" })}`, FLOOD]])
      expect(heapAfter - heapBefore, JSON.stringify(figures)).toBeLessThan(TOLERANCE)
    }), { timeout: 180_000 })
})
