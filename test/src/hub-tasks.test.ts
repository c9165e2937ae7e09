/**
 * MCP 2026-07-28 tasks at `/hub` (the `io.modelcontextprotocol/tasks` extension, ext-tasks
 * `specification/draft/tasks.md`), on the wire with plain fetch: the SDK v2 client has no task
 * runtime. First in one process (the wire: when a task is made, its states, cancel, owners,
 * bounds), then deployed over a real NATS, where a task outlives the edge that started it
 * (SIGKILL) and the registry replica that ran it (SIGTERM).
 */
import { describe, expect, it } from "@effect/vitest"
import { Edge } from "@switchboard/edge"
import { Registry } from "@switchboard/registry"
import { Router } from "@switchboard/router"
import { NatsServer } from "@switchboard/testing"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as Scope from "effect/Scope"
import { modernMeta, modernPost } from "./support/Modern.ts"
import * as Processes from "./support/Processes.ts"
import { busLayer, stack, token } from "./support/Stack.ts"
import { page, progressPage, tab } from "./support/Tabs.ts"

const services = Layer.mergeAll(Router.layer, Registry.layer)
/** One edge with the router and the registry, embedded bus; its base URL. */
const start = (env: Record<string, string> = {}) => Effect.map(Layer.build(stack(busLayer(), { services, env })), (ctx) => Context.get(ctx, Edge.EdgeServer).url)

const TASKS = "io.modelcontextprotocol/tasks"
const plain = modernMeta()
/** The `_meta` of a client that declares the tasks extension. */
const tasking = modernMeta({ capabilities: { extensions: { [TASKS]: {} } } })

interface Reply {
  readonly status: number
  readonly json: Record<string, unknown>
}

/** A modern POST to `<base>/hub`; `Mcp-Name` is the tool's name or the task's id, as the body says. */
const post = (base: string, t: string, body: Record<string, unknown>, headers: Record<string, string> = {}) =>
  Effect.map(modernPost(base, body, { token: t, headers }), (r): Reply => ({ status: r.status, json: r.json() }))

const callTool = (base: string, t: string, name: string, meta: Record<string, unknown>, text = "x") =>
  post(base, t, { jsonrpc: "2.0", id: 1, method: "tools/call", params: { name, arguments: { text }, _meta: meta } })
const taskRequest = (base: string, t: string, method: string, taskId: string, headers: Record<string, string> = {}, meta: Record<string, unknown> = tasking) =>
  post(base, t, { jsonrpc: "2.0", id: 2, method, params: { taskId, _meta: meta } }, headers)

const resultOf = (r: Reply) => r.json["result"] as Record<string, unknown>
const errorOf = (r: Reply) => [r.status, (r.json["error"] as { code: number }).code]

/** A tools/call that must come back as a task: its id. */
const createTask = (base: string, t: string, name: string, text = "x") =>
  Effect.gen(function*() {
    const created = yield* callTool(base, t, name, tasking, text)
    expect(created.status).toBe(200)
    const result = resultOf(created)
    expect(result).toMatchObject({ resultType: "task", status: "working", taskId: expect.any(String) })
    return result["taskId"] as string
  })

/** Polls `tasks/get` until the task is no longer working; its last answer. */
const settled = (base: string, t: string, taskId: string, timeout = 20_000) =>
  Effect.gen(function*() {
    const started = Date.now()
    for (;;) {
      const got = yield* taskRequest(base, t, "tasks/get", taskId)
      const result = resultOf(got)
      if (result !== undefined && result["status"] !== "working") return result
      if (Date.now() - started > timeout) return yield* Effect.dieMessage(`task ${taskId} never settled; last: ${JSON.stringify(got.json)}`)
      yield* Effect.sleep("50 millis")
    }
  })

/** Waits until `ok` holds of what `probe` sees (a tab's tools to appear, a page to be called). */
const until = (ok: () => boolean, what: string, probe: Effect.Effect<unknown> = Effect.void, timeout = 10_000) =>
  Effect.gen(function*() {
    const started = Date.now()
    while (!ok()) {
      if (Date.now() - started > timeout) return yield* Effect.dieMessage(`never: ${what}`)
      yield* probe
      yield* Effect.sleep("20 millis")
    }
  })

/** Until the user's tools/list has `name`. */
const listed = (base: string, t: string, name: string) =>
  Effect.gen(function*() {
    let names: Array<string> = []
    yield* until(() => names.includes(name), `${name} listed`, Effect.map(post(base, t, { jsonrpc: "2.0", id: 9, method: "tools/list", params: { _meta: plain } }), (r) => {
      names = ((resultOf(r)?.["tools"] ?? []) as Array<{ name: string }>).map((tool) => tool.name)
    }))
  })

const gated = () => {
  let open: () => void = () => undefined
  const gate = new Promise<void>((resolve) => (open = resolve))
  return { gate, open }
}

const NAME = "website_tool_shop_example_com_tab1_getCart"

describe("/hub tasks (MCP 2026-07-28, io.modelcontextprotocol/tasks)", () => {
  it.scopedLive("server/discover advertises the extension; a tools/call is a task only when its client declares it, and tasks/get goes working → completed with the result", () =>
    Effect.gen(function*() {
      const base = yield* start()
      const { gate, open } = gated()
      const shop = yield* tab(base.replace("http", "ws"), page("shop", ["getCart"], { gate }), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      const t = yield* token({ sub: "alice" })
      const discover = yield* post(base, t, { jsonrpc: "2.0", id: "d", method: "server/discover", params: { _meta: plain } })
      expect(resultOf(discover)).toMatchObject({ capabilities: { extensions: { [TASKS]: {} } } })
      yield* listed(base, t, NAME)

      const created = yield* callTool(base, t, NAME, tasking, "task")
      const task = resultOf(created)
      expect(task).toMatchObject({ resultType: "task", status: "working", ttlMs: 3_600_000, pollIntervalMs: expect.any(Number) })
      expect(Date.parse(task["createdAt"] as string)).not.toBeNaN()
      const taskId = task["taskId"] as string
      // Stored before it was answered: a tasks/get resolves at once, while the page still works.
      expect(resultOf(yield* taskRequest(base, t, "tasks/get", taskId))).toMatchObject({ resultType: "complete", taskId, status: "working" })
      yield* until(() => shop.executed.length === 1, "the page is called")
      open()
      const done = yield* settled(base, t, taskId)
      expect(done).toMatchObject({ resultType: "complete", taskId, status: "completed", result: { content: [{ type: "text", text: "shop:getCart:task" }] } })
      expect(done["result"]).not.toHaveProperty("resultType")
      // tasks/update of a known task: an empty acknowledgement (no input is ever outstanding).
      expect(resultOf(yield* taskRequest(base, t, "tasks/update", taskId))).toMatchObject({ resultType: "complete" })

      // Without the extension: the result itself.
      const direct = yield* callTool(base, t, NAME, plain, "direct")
      expect(resultOf(direct)).toMatchObject({ resultType: "complete", content: [{ type: "text", text: "shop:getCart:direct" }] })
    }))

  it.scopedLive("a call that fails with a JSON-RPC error makes a failed task carrying that error", () =>
    Effect.gen(function*() {
      const base = yield* start({ REGISTRY_CALL_TIMEOUT: "300 millis" })
      const { gate } = gated()
      yield* tab(base.replace("http", "ws"), page("shop", ["getCart"], { gate }), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      const t = yield* token({ sub: "alice" })
      yield* listed(base, t, NAME)
      const taskId = yield* createTask(base, t, NAME)
      const failed = yield* settled(base, t, taskId)
      expect(failed).toMatchObject({ status: "failed", statusMessage: expect.stringContaining("timed out"), error: { code: -32603, message: expect.stringContaining("timed out") } })
      expect(failed).not.toHaveProperty("result")
    }))

  it.scopedLive("tasks/cancel is acknowledged, the page sees its call aborted, and the task says cancelled", () =>
    Effect.gen(function*() {
      const base = yield* start()
      const started = yield* Deferred.make<void>()
      const aborted = yield* Deferred.make<string>()
      const server = progressPage((_steps, extra) =>
        new Promise<void>((resolve) => {
          Deferred.unsafeDone(started, Effect.void)
          extra.signal.addEventListener("abort", () => {
            Deferred.unsafeDone(aborted, Effect.succeed(String(extra.signal.reason)))
            resolve()
          })
        })
      )
      yield* tab(base.replace("http", "ws"), server, { user: "alice", tabId: 1, url: "https://work.example.com/" })
      const t = yield* token({ sub: "alice" })
      const name = "website_tool_work_example_com_tab1_long"
      yield* listed(base, t, name)
      const created = yield* post(base, t, { jsonrpc: "2.0", id: 1, method: "tools/call", params: { name, arguments: { steps: 1 }, _meta: tasking } })
      const taskId = resultOf(created)["taskId"] as string
      yield* Deferred.await(started).pipe(Effect.timeout("10 seconds"), Effect.orDie)
      const cancel = yield* taskRequest(base, t, "tasks/cancel", taskId)
      expect(cancel.status).toBe(200)
      expect(resultOf(cancel)).toMatchObject({ resultType: "complete" })
      expect(yield* Deferred.await(aborted).pipe(Effect.timeout("10 seconds"), Effect.orDie)).toContain("cancelled the task")
      expect(yield* settled(base, t, taskId)).toMatchObject({ status: "cancelled" })
    }))

  it.scopedLive("a task is its owner's: another user's task id is not found, as is an unknown one; tasks/* need the extension and Mcp-Name", () =>
    Effect.gen(function*() {
      const base = yield* start()
      yield* tab(base.replace("http", "ws"), page("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      const alice = yield* token({ sub: "alice" })
      const bob = yield* token({ sub: "bob" })
      yield* listed(base, alice, NAME)
      const taskId = yield* createTask(base, alice, NAME)
      expect((yield* settled(base, alice, taskId))["status"]).toBe("completed")

      for (const method of ["tasks/get", "tasks/cancel", "tasks/update"]) {
        const stranger = yield* taskRequest(base, bob, method, taskId)
        expect(errorOf(stranger)).toEqual([200, -32602])
        expect(stranger.json["error"]).toMatchObject({ message: "Failed to retrieve task: Task not found" })
      }
      expect(errorOf(yield* taskRequest(base, alice, "tasks/get", "00000000-0000-0000-0000-000000000000"))).toEqual([200, -32602])
      expect(errorOf(yield* taskRequest(base, alice, "tasks/get", ""))).toEqual([200, -32602])
      expect(errorOf(yield* taskRequest(base, alice, "tasks/get", "x".repeat(2_000)))).toEqual([200, -32602])
      expect(errorOf(yield* taskRequest(base, alice, "tasks/get", taskId, { "mcp-name": "other" }))).toEqual([400, -32020])
      const undeclared = yield* taskRequest(base, alice, "tasks/get", taskId, {}, plain)
      expect(errorOf(undeclared)).toEqual([400, -32021])
      expect(undeclared.json["error"]).toMatchObject({ data: { requiredCapabilities: { extensions: { [TASKS]: {} } } } })
      // Bob's attempts changed nothing of Alice's.
      expect(resultOf(yield* taskRequest(base, alice, "tasks/get", taskId))).toMatchObject({ status: "completed" })
    }))

  it.scopedLive("tasks are bounded per user (past REGISTRY_MAX_TASKS_PER_USER a call is answered directly) and by age (REGISTRY_TASK_TTL)", () =>
    Effect.gen(function*() {
      const base = yield* start({ REGISTRY_MAX_TASKS_PER_USER: "2", REGISTRY_TASK_TTL: "2 seconds" })
      yield* tab(base.replace("http", "ws"), page("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      const alice = yield* token({ sub: "alice" })
      const bob = yield* token({ sub: "bob" })
      yield* tab(base.replace("http", "ws"), page("shop", ["getCart"]), { user: "bob", tabId: 1, url: "https://shop.example.com/" })
      yield* listed(base, alice, NAME)
      yield* listed(base, bob, NAME)
      const first = yield* createTask(base, alice, NAME, "1")
      expect(resultOf(yield* taskRequest(base, alice, "tasks/get", first))["ttlMs"]).toBe(2_000)
      yield* createTask(base, alice, NAME, "2")
      const third = yield* callTool(base, alice, NAME, tasking, "3")
      expect(resultOf(third)).toMatchObject({ resultType: "complete", content: [{ type: "text", text: "shop:getCart:3" }] })
      // The bound is per user: Bob still gets a task.
      yield* createTask(base, bob, NAME)
      // Past its ttl a task is gone, and its place is free again.
      let gone = false
      yield* until(() => gone, "the task expires", Effect.map(taskRequest(base, alice, "tasks/get", first), (r) => void (gone = r.json["error"] !== undefined)))
      yield* createTask(base, alice, NAME, "4")
    }))
})

/**
 * The gated page holds its call while a replica starts and another dies: on two loaded cores that
 * outlasts the default 10 s call timeout, which would fail the task before the test looks at it.
 */
const patient = { REGISTRY_CALL_TIMEOUT: "2 minutes" }

/** Each test gets a NATS of its own, and its processes stop before their NATS does. */
const withNats = <A, E>(test: Effect.Effect<A, E, NatsServer | Scope.Scope>) => Effect.scoped(test).pipe(Effect.provide(NatsServer.layer))

describe("/hub tasks across processes", () => {
  it.live("a task completes after the edge that started it is SIGKILLed (polled on the other edge) and the registry replica that ran it stops (another runs its call again on the next tasks/get)", () =>
    Effect.gen(function*() {
      const { url } = yield* NatsServer
      // One replica at first, so that it is the one that runs the task; the second comes after.
      const { edges: [a, b], namespace, registries: [first] } = yield* Processes.deployment(url, { edges: 2, registry: true, env: patient })
      if (a === undefined || b === undefined || first === undefined) return yield* Effect.dieMessage("the deployment is short of an edge or a replica")
      const { gate, open } = gated()
      const shop = yield* tab(b.ws, page("shop", ["getCart"], { gate }), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      const t = yield* token({ sub: "alice" })
      yield* listed(a.url, t, NAME)
      const taskId = yield* createTask(a.url, t, NAME, "survivor")
      yield* until(() => shop.executed.length === 1, "the page is called")
      // The edge that started the task dies; from here on the client polls the other one.
      yield* a.kill("SIGKILL")
      yield* a.exited
      expect(resultOf(yield* taskRequest(b.url, t, "tasks/get", taskId))).toMatchObject({ status: "working" })
      // Then the replica running its call stops, with another to take over.
      yield* Processes.registry({ natsUrl: url, namespace, env: patient })
      yield* first.kill("SIGTERM")
      yield* first.exited
      // The survivor finds the task without a runner and sends the call again; the page's first
      // answer would go to the stopped replica, so the page answers both once they are both in.
      yield* until(() => shop.executed.length === 2, "the call is sent again", Effect.asVoid(taskRequest(b.url, t, "tasks/get", taskId)), 30_000)
      open()
      expect(yield* settled(b.url, t, taskId)).toMatchObject({
        status: "completed",
        result: { content: [{ type: "text", text: "shop:getCart:survivor" }] },
        statusMessage: expect.stringContaining("sent again")
      })
    }).pipe(withNats), 150_000)

  it.live("a task whose replica was SIGKILLed is run again once that replica's liveness key lapses", () =>
    Effect.gen(function*() {
      const { url } = yield* NatsServer
      const { edges: [a], namespace, registries: [first] } = yield* Processes.deployment(url, { edges: 1, registry: true, env: patient })
      if (a === undefined || first === undefined) return yield* Effect.dieMessage("the deployment is short of an edge or a replica")
      const { gate, open } = gated()
      const shop = yield* tab(a.ws, page("shop", ["getCart"], { gate }), { user: "alice", tabId: 1, url: "https://shop.example.com/" })
      const t = yield* token({ sub: "alice" })
      yield* listed(a.url, t, NAME)
      const taskId = yield* createTask(a.url, t, NAME, "killed")
      yield* until(() => shop.executed.length === 1, "the page is called")
      const second = yield* Processes.registry({ natsUrl: url, namespace, env: patient })
      yield* first.kill("SIGKILL")
      yield* first.exited
      // Until its key lapses the dead replica counts as running the call: the task stays working.
      // NATS may still route the queue group to the killed replica's subscription for a moment,
      // and a request sent then is lost with it (core NATS delivers at most once): the edge would
      // answer 504 after EDGE_HTTP_RESPONSE_TIMEOUT. A client polls again; so does this one, a
      // second later, well before the key can lapse (6 s after the replica's last heartbeat).
      const working = yield* taskRequest(a.url, t, "tasks/get", taskId).pipe(Effect.timeout("1 second"), Effect.retry({ times: 3 }), Effect.orDie)
      expect(resultOf(working)).toMatchObject({ status: "working" })
      expect(shop.executed).toHaveLength(1)
      yield* until(() => shop.executed.length === 2, "the call is sent again", Effect.asVoid(taskRequest(a.url, t, "tasks/get", taskId)), 30_000)
      // The tab's answers reach a call through the tab's actor, which the survivor adopts from KV
      // on its own sweep: an answer before that is lost, for a task's call as for any other.
      yield* until(() => /adopted \d+ connections/.test(second.output()), "the survivor adopts the tab", Effect.void, 30_000)
      open()
      expect(yield* settled(a.url, t, taskId)).toMatchObject({ status: "completed", result: { content: [{ type: "text", text: "shop:getCart:killed" }] } })
    }).pipe(withNats), 150_000)
})
