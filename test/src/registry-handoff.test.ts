/**
 * A registry replica that stops (SIGTERM: its scope closes) hands its `/hub` session and its tab
 * to the other replica with `tools/call`s in flight: over NATS, a hub client keeps 50 calls
 * unanswered at the tab while the replica that owns both sockets stops. The tab answers them after
 * the move; every call must get its own answer there, none may be lost, none answered twice.
 */
import { describe, expect, it } from "@effect/vitest"
import { Actors, Kv, Subjects } from "@switchboard/bus"
import { Edge } from "@switchboard/edge"
import { Registry } from "@switchboard/registry"
import { NatsServer } from "@switchboard/testing"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import type { TestClient } from "./support/Client.ts"
import type { Message } from "./support/ProxyPeers.ts"
import { sseStream } from "./support/Sse.ts"
import { busLayer, namespace, natsEdge, replica, stack, token } from "./support/Stack.ts"
import { throughStop } from "./support/Traffic.ts"
import { rawHub, rawTab, tabFrames } from "./support/Tabs.ts"

// A slow heartbeat: survivors would adopt the stopped replica's sockets from KV only ~9 s after
// it stopped, long after this test has judged the hand-off.
const env = { REGISTRY_REPLICA_HEARTBEAT: "3 seconds" }
const IN_FLIGHT = 50
const TOOL = "website_tool_shop_example_com_tab1_echo"

const next = (c: TestClient) => c.next as Effect.Effect<Message>

describe("registry hand-off", () => {
  it.scopedLive("a stopping replica hands its /hub session and tab over with calls in flight: none lost, none answered wrong", () =>
    Effect.gen(function*() {
      const { servers, ns, ctx, ws } = yield* natsEdge(env)
      const start = replica(Registry.layer, servers, ns, env)

      const first = yield* start
      const tab = yield* rawTab(ws, "alice")
      tab.send(tabFrames.hello(1, "https://shop.example.com/", { id: "hello" }))
      expect(yield* next(tab)).toMatchObject({ id: "hello", result: { tabId: 1 } })
      tab.send(tabFrames.register([tabFrames.tool("echo")], "register"))
      expect(yield* next(tab)).toMatchObject({ id: "register", result: { registered: 1 } })
      const hub = yield* rawHub(ws, "alice")
      // The session's view follows KV: the tool is listed once the tab's record reached it.
      for (let listed = false; !listed;) {
        hub.send({ jsonrpc: "2.0", id: "list", method: "tools/list" })
        const m = yield* next(hub)
        listed = m.id === "list" && ((m.result as { tools: Array<{ name: string }> }).tools).some((t) => t.name === TOOL)
      }

      yield* start
      const connections = Kv.typed(yield* Context.get(ctx, Kv.Kv).bucket(Subjects.Bucket.connections), Actors.ConnectionRecord)
      const owners = connections.values().pipe(
        Effect.map((records) => new Set(records.filter((r) => r.value.service === "registry").map((r) => r.value.replica))),
        Effect.orDie
      )
      const before = yield* owners
      expect(before.size).toBe(1)

      // The tab answers each call with the number it was asked.
      const answer = ({ mapped, n }: { readonly mapped: string; readonly n: number }) =>
        tab.send({ jsonrpc: "2.0", id: mapped, result: { success: true, payload: { content: [{ type: "text", text: `echo ${n}` }] } } })
      const { errors, lost, seen, sent, stopMillis, wrong } = yield* throughStop({
        inFlight: IN_FLIGHT,
        send: (n) => hub.send({ jsonrpc: "2.0", id: n, method: "tools/call", params: { name: TOOL, arguments: { n } } }),
        received: Effect.map(next(tab), (got) => {
          expect(got.method).toBe("browser/executeTool")
          return { mapped: got.id as string, n: ((got.params as Message)["args"] as Message)["n"] as number }
        }),
        answer,
        reply: next(hub),
        // list_changed, when the tab's record moved, is no answer.
        isAnswer: (m) => m.id !== undefined,
        isOwn: (n, m) => ((m.result as Message)["content"] as Array<Message>)[0]?.["text"] === `echo ${n}`
      }, first.stop)
      console.log(`registry hand-off under traffic: ${sent} calls, stop took ${stopMillis} ms, lost ${lost}, errors ${errors}, wrong ${wrong}`)
      expect({ lost, wrong, errors }).toEqual({ lost: 0, wrong: 0, errors: 0 })
      // The tab saw every call once, in the client's order.
      expect(seen.map((s) => s.n)).toEqual(Array.from({ length: sent }, (_, i) => i + 1))
      expect(new Set(seen.map((s) => s.mapped)).size).toBe(sent)
      // Both sockets now belong to the other replica, and still talk.
      const now = yield* owners
      expect(now.size).toBe(1)
      expect([...now][0]).not.toBe([...before][0])
      hub.send({ jsonrpc: "2.0", id: "last", method: "tools/call", params: { name: TOOL, arguments: { n: -1 } } })
      const last = yield* next(tab)
      answer({ mapped: last.id as string, n: -1 })
      expect(yield* next(hub)).toMatchObject({ id: "last", result: { content: [{ type: "text", text: "echo -1" }] } })
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)

  it.scopedLive("a Streamable HTTP session's calls in flight are answered on their POSTs by the replica it was handed to", () =>
    Effect.gen(function*() {
      const { servers } = yield* NatsServer
      const ns = namespace()
      const ctx = yield* Layer.build(stack(busLayer(servers, ns), { env }))
      const base = Context.get(ctx, Edge.EdgeServer).url
      const start = replica(Registry.layer, servers, ns, env)
      const first = yield* start
      const tab = yield* rawTab(base.replace("http", "ws"), "alice")
      tab.send(tabFrames.hello(1, "https://shop.example.com/", { id: "hello" }))
      expect(yield* next(tab)).toMatchObject({ id: "hello" })
      tab.send(tabFrames.register([tabFrames.tool("echo")], "register"))
      expect(yield* next(tab)).toMatchObject({ id: "register" })

      const t = yield* token({ sub: "alice" })
      const post = (body: object, session?: string) =>
        Effect.promise(async () => {
          const res = await fetch(`${base}/hub`, {
            method: "POST",
            headers: {
              authorization: `Bearer ${t}`,
              accept: "application/json, text/event-stream",
              "content-type": "application/json",
              ...(session === undefined ? {} : { "mcp-session-id": session, "mcp-protocol-version": "2025-06-18" })
            },
            body: JSON.stringify(body)
          })
          return { session: res.headers.get("mcp-session-id"), body: (await res.json()) as Message }
        })
      const init = yield* post({ jsonrpc: "2.0", id: 0, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "0" } } })
      const session = init.session ?? (yield* Effect.dieMessage("initialize returned no Mcp-Session-Id"))
      for (let listed = false; !listed;) {
        const r = yield* post({ jsonrpc: "2.0", id: "list", method: "tools/list" }, session)
        listed = ((r.body.result as { tools: Array<{ name: string }> }).tools).some((tool) => tool.name === TOOL)
      }
      yield* start
      // The session's GET stream, open across the stop: a change before it and one after it arrive
      // there, the second with the next id of the same epoch.
      const stream = yield* sseStream(base, t, session, "2025-06-18")
      const changed = { jsonrpc: "2.0", method: "notifications/tools/list_changed" }
      tab.send(tabFrames.register([tabFrames.tool("echo"), tabFrames.tool("before")], "before"))
      expect(yield* next(tab)).toMatchObject({ id: "before" })
      const before = yield* stream.next
      expect(JSON.parse(before.data)).toEqual(changed)

      // Every call waits at the tab, its POST open at the edge, while the replica stops.
      const calls = 20
      const answers = yield* Effect.forEach(
        Array.from({ length: calls }, (_, i) => i + 1),
        (n) => Effect.fork(post({ jsonrpc: "2.0", id: n, method: "tools/call", params: { name: TOOL, arguments: { n } } }, session))
      )
      const executed: Array<{ readonly mapped: string; readonly n: number }> = []
      while (executed.length < calls) {
        const got = yield* next(tab)
        executed.push({ mapped: got.id as string, n: ((got.params as Message)["args"] as Message)["n"] as number })
      }
      yield* first.stop
      for (const { mapped, n } of executed) {
        tab.send({ jsonrpc: "2.0", id: mapped, result: { success: true, payload: { content: [{ type: "text", text: `echo ${n}` }] } } })
      }
      const got = yield* Effect.forEach(answers, Fiber.join).pipe(Effect.timeout("10 seconds"))
      expect(got.map((r) => r.body)).toEqual(
        Array.from({ length: calls }, (_, i) => ({ jsonrpc: "2.0", id: i + 1, result: { content: [{ type: "text", text: `echo ${i + 1}` }] } }))
      )
      tab.send(tabFrames.register([tabFrames.tool("echo"), tabFrames.tool("before"), tabFrames.tool("after")], "after"))
      expect(yield* next(tab)).toMatchObject({ id: "after" })
      const after = yield* stream.next
      expect(JSON.parse(after.data)).toEqual(changed)
      const [epoch, n] = (before.id ?? "").split(".")
      expect(after.id).toBe(`${epoch}.${Number(n) + 1}`)
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)
})
