/**
 * `npm start`'s readiness (issue 26): the all-in-one's `/readyz` said 200 ("ready, but no live
 * replica of router, registry") before its own services ran, so a browser that connected at once
 * got 1013. Here `/readyz` is polled from the first moment the port answers: it is never 200 while
 * a service of the process is missing, and once it is 200 a tab and a hub open at once.
 */
import { describe, expect, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Schedule from "effect/Schedule"
import { NatsServer } from "@switchboard/testing"
import { freePort } from "./support/FreePort.ts"
import * as Processes from "./support/Processes.ts"
import { namespace } from "./support/Stack.ts"
import { rawHub, rawTab } from "./support/Tabs.ts"

interface Answer {
  readonly status: number
  readonly body: string
}

/** One look at `/readyz`; undefined while nothing listens on the port. */
const readyz = (base: string) =>
  Effect.promise(() =>
    fetch(`${base}/readyz`).then(
      async (r): Promise<Answer> => ({ status: r.status, body: (await r.text()).trim() }),
      () => undefined
    )
  )

/** Polls from before the process listens until `/readyz` says 200; then a tab and a hub connect. */
const probe = (natsUrl?: string) =>
    Effect.gen(function*() {
      const port = yield* freePort
      const base = `http://127.0.0.1:${port}`
      // Not awaited: the process is probed from before it logs that it listens.
      const started = yield* Effect.forkScoped(Processes.allInOne({ namespace: namespace(), env: { PORT: String(port) }, ...(natsUrl === undefined ? {} : { natsUrl }) }))
      const answers: Array<Answer> = []
      yield* readyz(base).pipe(
        Effect.tap((a) => Effect.sync(() => a !== undefined && answers.push(a))),
        Effect.repeat({ schedule: Schedule.spaced("5 millis"), until: (a) => a?.status === 200 }),
        Effect.timeoutFail({ duration: "90 seconds", onTimeout: () => new Error(`never ready: ${JSON.stringify(answers.slice(-3))}`) }),
        Effect.orDie
      )
      // At once, before anything else can start: an upgrade to each path of the registry.
      const ws = `ws://127.0.0.1:${port}`
      const tab = yield* rawTab(ws, "alice")
      tab.send({ jsonrpc: "2.0", id: 1, method: "ping" })
      expect(yield* tab.next).toMatchObject({ jsonrpc: "2.0", id: 1 })
      yield* rawHub(ws, "alice")

      const proc = yield* Fiber.join(started)
      const distinct = [...new Set(answers.map((a) => `${a.status} ${a.body}`))]
      console.log(JSON.stringify({ readyzAnswers: answers.length, distinct }))
      expect(distinct.filter((a) => a.startsWith("200"))).toEqual(["200 ready"])
      for (const a of distinct.filter((a) => !a.startsWith("200"))) expect(a).toMatch(/^503 not ready: (no live replica of|starting)/)
      expect(proc.output()).not.toContain("1013")
    })

describe("readiness of npm start", () => {
  it.scopedLive("on the embedded bus, /readyz is 503 until every service of the process runs; once it is 200, /tabs and /hub open at once", () => probe(), 120_000)

  // Scoped inside the server's layer: the process stops while its NATS server still runs. Stopped
  // after the server, it spent some 20 s of its shutdown on the missing server.
  it.scopedLive("on NATS, the same", () =>
    Effect.flatMap(NatsServer, ({ url }) => probe(url)).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 120_000)
})
