/**
 * Refused tokens must not be a way to fill a shared process's memory (issue 26, item 4): every
 * service keeps what auth said of a token for a while, and each refused garbage token used to be
 * kept under its whole text, 10,000 of them. Here `npm start`'s process takes a flood of distinct
 * garbage bearer tokens on `GET /v0/topics` while a good user keeps calling it, and its heap after
 * a forced collection must stay where it was; the good user's verdict must stay cached throughout.
 */
import { describe, expect, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import { randomBytes } from "node:crypto"
import { readFileSync } from "node:fs"
import * as Http from "node:http"
import * as Inspector from "./support/Inspector.ts"
import * as Processes from "./support/Processes.ts"
import { namespace, token } from "./support/Stack.ts"

const MiB = 1024 * 1024
/** Under the ~8 KiB cap the edge may put on tokens, so the flood still reaches the services then. */
const TOKEN_CHARS = 7_000
/** The first part of the flood, after which the heap is read: fewer than the 10,000 the old cache cleared at. */
const FIRST = 8_000
const FLOOD = 10_000
const CONCURRENCY = 50
/** What the flood may leave on the heap: the bounded table of refusals and the collector's noise. */
const TOLERANCE = 4 * MiB

/** Resident set of a process, from /proc: the figure an operator's limit applies to. */
const rss = (pid: number) => {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))
  return m?.[1] === undefined ? Number.NaN : Number(m[1]) * 1024
}

const status = (agent: Http.Agent, base: string, bearer: string) =>
  new Promise<number>((resolve, reject) => {
    Http.get(`${base}/v0/topics`, { agent, headers: { authorization: `Bearer ${bearer}` } }, (res) => {
      res.resume()
      res.on("end", () => resolve(res.statusCode ?? 0))
    }).on("error", reject)
  })

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
        const rssBefore = rss(proc.pid)
        const invalidBefore = yield* checks(metrics, "invalid")
        const started = Date.now()

        expect(yield* flood(FIRST, good)).toEqual([])
        const heapMid = yield* inspector.heapAfterGc
        const rssMid = rss(proc.pid)
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
        const rssAfter = rss(proc.pid)
        const validAfter = yield* checks(metrics, "valid")
        const invalidAfter = yield* checks(metrics, "invalid")

        console.log(JSON.stringify({
          flood: `${FLOOD} x ${TOKEN_CHARS} chars`,
          seconds,
          lastPartSeconds: lastSeconds,
          heapBeforeMiB: +(heapBefore / MiB).toFixed(1),
          heapAfter8000MiB: +(heapMid / MiB).toFixed(1),
          heapAfterMiB: +(heapAfter / MiB).toFixed(1),
          rssBeforeMiB: +(rssBefore / MiB).toFixed(1),
          rssAfter8000MiB: +(rssMid / MiB).toFixed(1),
          rssAfterMiB: +(rssAfter / MiB).toFixed(1),
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
})
