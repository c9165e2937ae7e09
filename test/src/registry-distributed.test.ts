/**
 * The MCP-B tool registry deployed as it runs in production: auth, router, registry and two edges
 * as separate OS processes on a real NATS, real sockets. Tabs sit on edge A and the SDK client on
 * edge B, so every listing, call and answer crosses processes; registry.test.ts covers the logic.
 */
import type { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { describe, expect, it } from "@effect/vitest"
import { NatsServer } from "@switchboard/testing"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import * as Processes from "./support/Processes.ts"
import { extensionOf, next } from "./support/ProxyPeers.ts"
import { hub, page, tab, textOf, toolsUntil } from "./support/Tabs.ts"

const deploy = Effect.gen(function*() {
  const { url } = yield* NatsServer
  const { edges: [a, b] } = yield* Processes.deployment(url, { edges: 2, registry: true })
  if (a === undefined || b === undefined) return yield* Effect.dieMessage("the deployment has fewer than two edges")
  return { a: a.ws, b: b.ws }
})

/** Each test gets a NATS of its own, and its processes stop before their NATS does. */
const withNats = <A, E>(test: Effect.Effect<A, E, NatsServer | Scope.Scope>) => Effect.scoped(test).pipe(Effect.provide(NatsServer.layer))

const call = (client: Client, name: string, text = "") => Effect.promise(() => client.callTool({ name, arguments: { text } }))
const callError = (client: Client, name: string) =>
  Effect.promise(() => client.callTool({ name, arguments: {} }).then(() => undefined, (e: unknown) => e as { code: number; message: string }))

describe("MCP-B tool registry across processes", () => {
  it.live("a client on edge B lists and calls tabs on edge A, and hears list_changed when a third registers", () =>
    Effect.gen(function*() {
      const { a, b } = yield* deploy
      yield* tab(a, page("shop", ["getCart", "addItem"]), { user: "alice", tabId: 1, url: "https://shop.example.com/cart" })
      const dev = yield* tab(a, page("dev", ["build"]), { user: "alice", tabId: 7, url: "http://localhost:3000/" })
      const { changes, client } = yield* hub(b, "alice")
      const tools = yield* toolsUntil(client, (n) => n.length === 3)
      expect(tools.map((t) => t.name).sort()).toEqual([
        "website_tool_localhost_3000_tab7_build",
        "website_tool_shop_example_com_tab1_addItem",
        "website_tool_shop_example_com_tab1_getCart"
      ])
      expect(textOf(yield* call(client, "website_tool_localhost_3000_tab7_build", "now"))).toBe("dev:build:now")
      expect(dev.executed.map((e) => e.toolName)).toEqual(["build"])

      // No tools/list in between: the notification alone must say the list changed.
      const before = changes.length
      yield* tab(a, page("docs", ["search"]), { user: "alice", tabId: 9, url: "https://docs.example.org/" })
      yield* Effect.suspend(() => (changes.length > before ? Effect.void : Effect.fail("no list_changed yet"))).pipe(
        Effect.retry(Schedule.spaced("20 millis")),
        Effect.timeout("10 seconds"),
        Effect.orDie
      )
      yield* toolsUntil(client, (n) => n.length === 4 && n.includes("website_tool_docs_example_org_tab9_search"))
    }).pipe(withNats), 120_000)

  it.live("a cached tool whose tab closed has the extension on edge A open one, and the call runs there", () =>
    Effect.gen(function*() {
      const { a, b } = yield* deploy
      const first = yield* tab(a, page("first", ["compose"], { cache: true }), { user: "alice", tabId: 5, url: "https://mail.example.net/inbox" })
      const { client } = yield* hub(b, "alice")
      yield* toolsUntil(client, (n) => n.length === 2)
      yield* Effect.promise(() => first.close())
      const name = "website_tool_mail_example_net_compose"
      // The tab's own entry goes; the cached, domain-level one stays.
      yield* toolsUntil(client, (n) => n.length === 1 && n[0] === name)

      const ext = yield* extensionOf(a, "alice")
      const pending = yield* Effect.fork(call(client, name, "hi"))
      // registry → router (internal client) → edge A → extension, all over NATS.
      const createTab = yield* next(ext.c)
      expect(createTab).toMatchObject({ method: "createTab", params: { url: "https://mail.example.net/inbox" }, id: expect.stringMatching(/^proxy:/) })
      ext.c.send({ jsonrpc: "2.0", id: createTab.id, result: { tabId: 6 } })
      const opened = yield* tab(a, page("opened", ["compose"], { cache: true }), { user: "alice", tabId: 6, url: "https://mail.example.net/" })
      expect(textOf(yield* pending.await.pipe(Effect.flatten))).toBe("opened:compose:hi")
      expect(opened.executed).toHaveLength(1)
    }).pipe(withNats), 120_000)

  it.live("another user on edge B sees none of the tools and cannot call them", () =>
    Effect.gen(function*() {
      const { a, b } = yield* deploy
      const own = yield* tab(a, page("alice", ["secret"], { cache: true }), { user: "alice", tabId: 1, url: "https://bank.example.com/" })
      const alice = yield* hub(b, "alice")
      yield* toolsUntil(alice.client, (n) => n.length === 2)
      const bob = yield* hub(b, "bob")
      expect((yield* Effect.promise(() => bob.client.listTools())).tools).toEqual([])
      for (const name of ["website_tool_bank_example_com_tab1_secret", "website_tool_bank_example_com_secret"]) {
        const error = yield* callError(bob.client, name)
        expect(error).toMatchObject({ code: -32602 })
      }
      // Bob's calls never reached the tab; alice's does.
      expect(own.executed).toEqual([])
      expect(textOf(yield* call(alice.client, "website_tool_bank_example_com_tab1_secret"))).toBe("alice:secret:")
      expect(own.executed).toHaveLength(1)
    }).pipe(withNats), 120_000)
})
