/**
 * Ctrl-C on `npm start` (SIGINT) with connections open. On the embedded bus no other process can
 * take a connection over, so the replicas' hand-off has nobody to go to, and saying so ("handed 0
 * of 3 connections over ... adopted from KV") warns about something that cannot happen.
 */
import { describe, expect, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import * as Processes from "./support/Processes.ts"
import { namespace } from "./support/Stack.ts"
import { hub, page, tab, toolsUntil } from "./support/Tabs.ts"

describe("npm start, stopped with connections open", () => {
  it.scopedLive("on the embedded bus, SIGINT stops it without a hand-off warning", () =>
    Effect.gen(function*() {
      const sb = yield* Processes.allInOne({ namespace: namespace() })
      yield* tab(sb.ws, page("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      const { client } = yield* hub(sb.ws, "alice")
      yield* toolsUntil(client, (n) => n.length === 1)

      yield* sb.kill("SIGINT")
      const exit = yield* sb.exited
      expect(exit, sb.output()).toMatchObject({ code: 0 })
      expect(sb.output()).not.toMatch(/handed \d+ of \d+ connections over|adopted from KV/)
    }), 90_000)
})
