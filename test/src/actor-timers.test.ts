/**
 * Issue 16: an actor's timers end with the actor, for any reason. A router and a registry,
 * composed in one process on the edge's own bus as `npm start` composes them, hold actors with
 * timers pending (a forwarded request, a tool call in flight, a call pausing before its retry)
 * when they stop with no replica to hand over to. The bus stays open, so a timer that outlived
 * its actor would reach a socket: nothing may, for longer than every timeout plus a margin. The
 * registry's calls in flight get their error as the replica stops, never later.
 */
import { describe, expect, it } from "@effect/vitest"
import { Bus, Subjects } from "@switchboard/bus"
import { Edge } from "@switchboard/edge"
import { Registry } from "@switchboard/registry"
import { Router } from "@switchboard/router"
import { NatsServer } from "@switchboard/testing"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Scope from "effect/Scope"
import { call, connected, handled, next } from "./support/ProxyPeers.ts"
import { busLayer, configFrom, stack } from "./support/Stack.ts"
import { rawHub, rawTab, tabFrames } from "./support/Tabs.ts"

const TIMEOUT_MILLIS = 3_000
const MARGIN_MILLIS = 1_500
const env = {
  ROUTER_REQUEST_TIMEOUT: `${TIMEOUT_MILLIS} millis`,
  REGISTRY_CALL_TIMEOUT: `${TIMEOUT_MILLIS} millis`,
  REGISTRY_RETRY_BACKOFF: `${TIMEOUT_MILLIS} millis`,
  // No survivor adopts the stopped actors from KV within the test.
  ROUTER_REPLICA_HEARTBEAT: "3 seconds",
  REGISTRY_REPLICA_HEARTBEAT: "3 seconds"
}

/** A tab of alice's serving one tool, registered. */
const openTab = (ws: string, tabId: number) =>
  Effect.gen(function*() {
    const tab = yield* rawTab(ws, "alice")
    tab.send(tabFrames.hello(tabId, "https://shop.example.com/", { id: "hello" }))
    expect(yield* next(tab)).toMatchObject({ id: "hello", result: { tabId } })
    tab.send(tabFrames.register([tabFrames.tool(`tool${tabId}`)], "register"))
    expect(yield* next(tab)).toMatchObject({ id: "register", result: { registered: 1 } })
    return tab
  })

describe("actor timers", () => {
  it.scopedLive("a stopped replica's pending timers never fire: no frame reaches any socket after it stops", () =>
    Effect.gen(function*() {
      const { servers } = yield* NatsServer
      const ctx = yield* Layer.build(stack(busLayer(servers), { env }))
      const ws = Context.get(ctx, Edge.EdgeServer).url.replace("http", "ws")
      // The services on the edge's bus, in a scope of their own: stopping them leaves the bus open.
      const services = yield* Scope.make()
      yield* Layer.buildWithScope(
        Layer.mergeAll(Registry.layer, Router.layer).pipe(Layer.provide(Layer.succeedContext(ctx)), Layer.provide(configFrom(env))),
        services
      )

      // Router: a request forwarded to the extension, which never answers.
      const { ext, mcp } = yield* connected(ws)
      mcp.send({ jsonrpc: "2.0", id: 10, method: "getTabs" })
      expect(yield* next(ext.c)).toMatchObject({ method: "getTabs" })

      // Registry: a call in flight at a tab that never answers, and a call whose tab closed
      // mid-call, waiting to be retried.
      const quiet = yield* openTab(ws, 1)
      const closing = yield* openTab(ws, 2)
      const hub = yield* rawHub(ws, "alice")
      for (let listed = 0; listed < 2;) {
        hub.send({ jsonrpc: "2.0", id: "list", method: "tools/list" })
        const m = yield* next(hub)
        if (m.id === "list") listed = (m.result as { tools: ReadonlyArray<unknown> }).tools.length
      }
      hub.send({ jsonrpc: "2.0", id: 1, method: "tools/call", params: { name: "website_tool_shop_example_com_tab1_tool1" } })
      expect(yield* next(quiet)).toMatchObject({ method: "browser/executeTool" })
      hub.send({ jsonrpc: "2.0", id: 2, method: "tools/call", params: { name: "website_tool_shop_example_com_tab2_tool2" } })
      expect(yield* next(closing)).toMatchObject({ method: "browser/executeTool" })
      closing.ws.close(1000)
      // The session hears the list changed in the same turn that puts call 2 in its retry pause.
      expect(yield* next(hub)).toMatchObject({ method: "notifications/tools/list_changed" })

      // Whatever the actors sent before they stop is read: a round trip through each actor comes
      // after it on the same socket.
      expect(yield* call(mcp, 11, "list_extensions")).toMatchObject({ id: 11 })
      yield* handled(ext.c)
      hub.send({ jsonrpc: "2.0", id: "ping", method: "ping" })
      expect(yield* next(hub)).toMatchObject({ id: "ping" })
      for (const c of [mcp, ext.c, quiet, hub]) yield* Queue.takeAll(c.messages)

      // Everything the edge would deliver to any socket from here on, counted on the bus.
      const edge = Context.get(ctx, Edge.EdgeServer)
      const bus = Context.get(ctx, Bus.Bus)
      let published = 0
      yield* Scope.close(services, Exit.void)
      yield* bus.subscribe(Subjects.edgeOut(edge.id), () => void published++)
      // Sent as the session's actor ended, before the stop returned.
      const stopped = [yield* next(hub), yield* next(hub)]
      expect(stopped).toEqual([1, 2].map((id) => ({ jsonrpc: "2.0", id, error: { code: -32000, message: expect.stringContaining("replica serving this session stopped") } })))

      // Longer than every timer the actors held; a frame within it is one that outlived its actor.
      const heard = yield* Effect.all(
        [mcp, ext.c, quiet, hub].map((c) => Queue.take(c.messages).pipe(Effect.timeout(TIMEOUT_MILLIS + MARGIN_MILLIS), Effect.option)),
        { concurrency: "unbounded" }
      )
      expect(heard.map((h) => Option.getOrUndefined(h))).toEqual([undefined, undefined, undefined, undefined])
      expect(published).toBe(0)
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 30_000)
})
