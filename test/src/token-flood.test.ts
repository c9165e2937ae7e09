/**
 * Issue 26, item 4, the edge's half: 10,000 distinct 15 KB garbage bearer tokens to `/v0/topics`
 * took RSS up by about half a GiB for half a minute, each refusal cached under its whole token.
 * The edge now refuses a token over `EDGE_MAX_TOKEN_BYTES` itself, before auth or any cache sees
 * it: the heap after a forced collection stays where it was. Measured in `npm start`'s process.
 */
import { describe, expect, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import { randomBytes } from "node:crypto"
import { readFileSync } from "node:fs"
import * as Http from "node:http"
import * as Inspector from "./support/Inspector.ts"
import * as Processes from "./support/Processes.ts"
import { namespace } from "./support/Stack.ts"

const MiB = 1024 * 1024
const TOKENS = 10_000
const TOKEN_BYTES = 15 * 1024
const CONCURRENCY = 32
/** What the flood may leave on the heap: the collector's noise, nothing per token. */
const TOLERANCE = 16 * MiB

/** The resident set of a process, from Linux's `/proc`. */
const rssOf = (pid: number) => Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? Number.NaN) * 1024

/** `GET /v0/topics` with one garbage token; its status and body. */
const refusedWith = (agent: Http.Agent, port: number, token: string) =>
  new Promise<{ readonly status: number; readonly body: string }>((resolve, reject) => {
    Http.get({ host: "127.0.0.1", port, path: "/v0/topics", agent, headers: { authorization: `Bearer ${token}` } }, (res) => {
      let body = ""
      res.setEncoding("utf8").on("data", (chunk: string) => (body += chunk))
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }))
    }).on("error", reject)
  })

describe("a flood of oversize tokens", () => {
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
          while (next < TOKENS) {
            next++
            // Distinct and base64url-shaped, as a forged JWT would be; never the same twice.
            const token = randomBytes((TOKEN_BYTES * 3) / 4).toString("base64url")
            const { status, body } = await refusedWith(agent, edge.port, token)
            const key = `${status} ${body.replace(/\d+ bytes/, "N bytes")}`
            answers.set(key, (answers.get(key) ?? 0) + 1)
          }
        }
        await Promise.all(Array.from({ length: CONCURRENCY }, worker))
      })
      const heapAfter = yield* inspector.heapAfterGc
      const rssAfter = rssOf(edge.pid)
      const figures = {
        tokens: TOKENS,
        tokenBytes: TOKEN_BYTES,
        heapBeforeMiB: +(heapBefore / MiB).toFixed(1),
        heapAfterMiB: +(heapAfter / MiB).toFixed(1),
        rssBeforeMiB: +(rssBefore / MiB).toFixed(1),
        rssAfterMiB: +(rssAfter / MiB).toFixed(1)
      }
      console.log(JSON.stringify({ flood: "oversize tokens", ...figures, answers: Object.fromEntries([...answers].map(([k, n]) => [k.slice(0, 80), n])) }))
      expect([...answers]).toEqual([[`401 ${JSON.stringify({ error: "invalid token: token too long: N bytes, at most 8192" })}`, TOKENS]])
      expect(heapAfter - heapBefore, JSON.stringify(figures)).toBeLessThan(TOLERANCE)
    }), { timeout: 180_000 })
})
