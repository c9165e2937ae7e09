/** The stale-tab sweep on the embedded bus: entries whose socket is gone go once old enough; live ones stay. */
import { describe, expect, it } from "@effect/vitest"
import { Kv, Subjects } from "@switchboard/bus"
import { Registry } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { eventually, tab, withRegistry } from "./Harness.ts"

const entry = (tabId: number, conn: string, updatedAt: number): Registry.TabRecord => ({
  user: "alice",
  domain: "shop.example.com",
  tabId,
  url: "https://shop.example.com/",
  conn,
  edge: "an-edge-that-died",
  activatedAt: 0,
  updatedAt,
  tools: [{ name: "getCart", inputSchema: { type: "object" } }]
})

describe("the stale-tab sweep", () => {
  it.live("prunes an old entry no connection owns, and keeps an old one whose socket is open", () =>
    withRegistry(Effect.gen(function*() {
      const kv = yield* Kv.Kv
      const tabs = Kv.typed(yield* kv.bucket(Subjects.Bucket.tabs), Registry.TabRecord)
      const key = (tabId: number) => Subjects.Key.tab("alice", "shop.example.com", tabId)
      const present = (tabId: number) => Effect.map(tabs.get(key(tabId)), Option.isSome)
      const longAgo = Date.now() - 60_000

      // A live tab whose entry has not changed for long: its socket is still open.
      const live = yield* tab({ user: "alice", tabId: 1, url: "https://shop.example.com/", tools: ["getCart"] })
      yield* tabs.put(key(1), { ...entry(1, live.client.conn, longAgo), edge: live.client.edge })
      // A fresh entry whose socket is gone: not old enough yet.
      yield* tabs.put(key(3), entry(3, "fresh-orphan", Date.now() + 60_000))

      yield* tabs.put(key(2), entry(2, "orphan-one", longAgo))
      yield* eventually(Effect.map(present(2), (p) => !p), "the first orphan pruned")
      // A second orphan, written after the first was pruned, goes in a later pass: that pass saw the live tab too.
      yield* tabs.put(key(4), entry(4, "orphan-two", longAgo))
      yield* eventually(Effect.map(present(4), (p) => !p), "the second orphan pruned")
      expect(yield* present(1)).toBe(true)
      expect(yield* present(3)).toBe(true)
    }), { REGISTRY_STALE_TAB_AGE: "50 millis" }))
})
