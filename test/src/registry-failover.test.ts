/**
 * Registry replicas survive each other: over NATS, two replicas on their own connections; the one
 * holding a live `/hub` session and its tab stops, and the other adopts both sockets, rebuilding
 * them from `registry_sessions` and `registry_tabs`, so the same MCP client carries on.
 */
import type { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { describe, expect, it } from "@effect/vitest"
import { Actors, Kv, Subjects } from "@switchboard/bus"
import { Registry } from "@switchboard/registry"
import { NatsServer } from "@switchboard/testing"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import { natsEdge, replica } from "./support/Stack.ts"
import { hub, page, tab, textOf, toolsUntil } from "./support/Tabs.ts"

const env = { REGISTRY_REPLICA_HEARTBEAT: "200 millis" }

const call = (client: Client, name: string, text: string) => Effect.promise(() => client.callTool({ name, arguments: { text } }))

describe("registry replicas", () => {
  it.scopedLive("a stopped replica's /hub session and tabs carry on at the other, on the same sockets, a tab that authenticated in-band too", () =>
    Effect.gen(function*() {
      const { servers, ns, ctx, ws } = yield* natsEdge(env)
      const start = replica(Registry.layer, servers, ns, env)

      const first = yield* start
      yield* tab(ws, page("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      // Its upgrade had no token: the replica that adopts it learns its user from its record.
      yield* tab(ws, page("mail", ["inbox"]), { user: "alice", tabId: 2, url: "https://mail.example.com/", auth: "in-band" })
      const { changes, client } = yield* hub(ws, "alice")
      const name = "website_tool_shop_example_com_tab1_getCart"
      const inBand = "website_tool_mail_example_com_tab2_inbox"
      yield* toolsUntil(client, (n) => n.length === 2)
      expect(textOf(yield* call(client, name, "before"))).toBe("shop:getCart:before")
      expect(textOf(yield* call(client, inBand, "before"))).toBe("mail:inbox:before")

      /** The replicas that own the registry's connections. */
      const connections = Kv.typed(yield* Context.get(ctx, Kv.Kv).bucket(Subjects.Bucket.connections), Actors.ConnectionRecord)
      const owners = connections.values().pipe(
        Effect.map((records) => new Set(records.filter((r) => r.value.service === "registry").map((r) => r.value.replica))),
        Effect.orDie
      )
      const before = yield* owners
      expect(before.size).toBe(1)

      yield* start
      // Frames sent before the survivor has adopted the sockets are lost, so wait for the adoption.
      yield* first.stop
      const after = yield* owners.pipe(
        Effect.filterOrFail((ids) => ids.size === 1 && ![...ids].some((id) => before.has(id)), () => new Error("not adopted yet")),
        Effect.retry(Schedule.spaced("50 millis")),
        Effect.timeout("10 seconds")
      )
      expect(after.size).toBe(1)

      // The SDK transport never reconnects: this is the same socket, now served by the survivor,
      // which must know the session is initialized and whose user it is.
      expect((yield* Effect.promise(() => client.listTools())).tools.map((t) => t.name).sort()).toEqual([inBand, name])
      expect(textOf(yield* call(client, name, "after"))).toBe("shop:getCart:after")
      expect(textOf(yield* call(client, inBand, "after"))).toBe("mail:inbox:after")

      // The adopted session follows its user's tools and tells the client when they change.
      const heard = changes.length
      yield* tab(ws, page("docs", ["search"]), { user: "alice", tabId: 3, url: "https://docs.example.org/" })
      yield* Effect.suspend(() => (changes.length > heard ? Effect.void : Effect.fail("no list_changed yet"))).pipe(
        Effect.retry(Schedule.spaced("20 millis")),
        Effect.timeout("5 seconds"),
        Effect.orDie
      )
      yield* toolsUntil(client, (n) => n.length === 3)
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)
})
