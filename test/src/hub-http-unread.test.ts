/**
 * Streamable HTTP responses that their client never reads (issue 26, item 1): a raw TCP client
 * sends its request and then stops reading. The edge must cut such a response at
 * `EDGE_OUTBOUND_HWM` (or once its bytes stop moving for `EDGE_HTTP_WRITE_STALL`), cancel a POST's
 * request towards the tab, and keep its memory, while another user's calls go on as before. The
 * memory checks run against `npm start`'s process as a real child, read through its inspector;
 * the rest against an edge and registry in this process.
 */
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js"
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js"
import { describe, expect, it } from "@effect/vitest"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import { Bus, Subjects } from "@switchboard/bus"
import { Edge } from "@switchboard/edge"
import { Registry } from "@switchboard/registry"
import * as Context from "effect/Context"
import * as Layer from "effect/Layer"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import * as Flood from "./support/Flood.ts"
import { liveHeap } from "./support/Heap.ts"
import * as Inspector from "./support/Inspector.ts"
import * as Processes from "./support/Processes.ts"
import { MiB, mib, peakRss, rssOf } from "./support/Rss.ts"
import { sseStream } from "./support/Sse.ts"
import { busLayer, namespace, stack, token } from "./support/Stack.ts"
import { hub, page, tab, textOf, toolsUntil } from "./support/Tabs.ts"

const BOTH = "application/json, text/event-stream"
const VERSION = "2025-06-18"

/** A plain JSON POST to `/hub` (`initialize` without a session); the answer's status, session and body. */
const post = (base: string, t: string, message: object, session?: string) =>
  Effect.promise(async () => {
    const res = await fetch(`${base}/hub`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${t}`,
        accept: BOTH,
        "content-type": "application/json",
        "mcp-protocol-version": VERSION,
        ...(session === undefined ? {} : { "mcp-session-id": session })
      },
      body: JSON.stringify(message)
    })
    return { status: res.status, session: res.headers.get("mcp-session-id"), text: await res.text() }
  })

/** A Streamable HTTP session of the user whose token is `t`, initialized and with its tools listed once. */
const session = (base: string, t: string) =>
  Effect.gen(function*() {
    const init = yield* post(base, t, { jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: VERSION, capabilities: {}, clientInfo: { name: "unread", version: "0" } } })
    expect(init.status).toBe(200)
    const id = init.session
    if (id === null) return yield* Effect.dieMessage("initialize returned no Mcp-Session-Id")
    expect((yield* post(base, t, { jsonrpc: "2.0", method: "notifications/initialized" }, id)).status).toBe(202)
    expect((yield* post(base, t, { jsonrpc: "2.0", id: 2, method: "tools/list" }, id)).status).toBe(200)
    return id
  })

/** Another user, calling an echo tool over a WebSocket and over Streamable HTTP until `stop`; what went wrong, and how many calls went right. */
const bystander = (proc: Processes.EdgeProcess, stop: Deferred.Deferred<void>) =>
  Effect.gen(function*() {
    const user = "bob"
    yield* tab(proc.ws, page("calm", ["echo"]), { user, tabId: 1, url: "https://calm.example.com/" })
    const { client: wsClient } = yield* hub(proc.ws, user)
    const [tool] = yield* toolsUntil(wsClient, (names) => names.length === 1)
    const name = tool?.name ?? ""
    const t = yield* token({ sub: user })
    const httpClient = yield* Effect.acquireRelease(
      Effect.promise(async () => {
        const c = new Client({ name: "bystander", version: "0.0.0" })
        await c.connect(new StreamableHTTPClientTransport(new URL(`${proc.url}/hub`), { requestInit: { headers: { Authorization: `Bearer ${t}` } } }))
        return c
      }),
      (c) => Effect.promise(() => c.close())
    )
    const seen = { ok: 0, failures: [] as Array<string> }
    const one = (c: Client, text: string) =>
      Effect.tryPromise(() => c.callTool({ name, arguments: { text } })).pipe(
        Effect.match({
          onFailure: (e) => void seen.failures.push(`${text}: ${String(e.error)}`),
          onSuccess: (r) => (textOf(r) === `calm:echo:${text}` ? void seen.ok++ : void seen.failures.push(`${text}: ${JSON.stringify(r)}`))
        })
      )
    let n = 0
    const loop = Effect.gen(function*() {
      while (!(yield* Deferred.isDone(stop))) {
        n++
        yield* Effect.all([one(wsClient, `ws ${n}`), one(httpClient, `http ${n}`)], { concurrency: 2 })
        yield* Effect.sleep("20 millis")
      }
    })
    const fiber = yield* Effect.fork(loop)
    return { seen, done: Fiber.join(fiber) }
  })

/** The edge's counter of cut responses for `reason`, from its /metrics (0 when it has none). */
const cuts = (proc: { readonly url: string }, reason: string) =>
  Effect.promise(() => fetch(`${proc.url}/metrics`).then((r) => r.text())).pipe(
    Effect.map((text) => Number(new RegExp(`^switchboard_edge_http_responses_cut_total\\{reason="${reason}"\\} (\\d+)`, "m").exec(text)?.[1] ?? 0))
  )

/** A flooding tab of `user`; the reason its call was cancelled, or the end of its flood. */
const floodTab = (proc: Processes.EdgeProcess, user: string, limit: number) =>
  Effect.gen(function*() {
    const cancelled = yield* Deferred.make<string>()
    const exhausted = yield* Deferred.make<void>()
    yield* Flood.floodTab(proc, user, limit, {
      cancelled: (reason) => Deferred.unsafeDone(cancelled, Exit.succeed(reason)),
      exhausted: () => Deferred.unsafeDone(exhausted, Exit.void)
    })
    return { cancelled, exhausted }
  })

const memory = (proc: Processes.EdgeProcess, inspector: Inspector.Inspector) =>
  Effect.map(inspector.heapAfterGc, (heap) => ({ heap, rss: rssOf(proc.pid) }))

/** The registry's own deadline for a call must not be what ends it here. */
const LONG_CALLS = { REGISTRY_CALL_TIMEOUT: "10 minutes" }

describe("Streamable HTTP responses nobody reads", () => {
  it.scopedLive("a tools/call whose client stops reading is cut at EDGE_OUTBOUND_HWM, the tab is told it is cancelled, memory stays bounded, and another user's calls go on", () =>
    Effect.gen(function*() {
      const proc = yield* Processes.allInOne({ namespace: namespace(), nodeArgs: ["--inspect=127.0.0.1:0"], env: { LOG_LEVEL: "info", ...LONG_CALLS } })
      const inspector = yield* Inspector.attach(proc)
      const stop = yield* Deferred.make<void>()
      const bob = yield* bystander(proc, stop)
      // 400 MiB in all if nothing stops it; the edge's bound is 8 MiB.
      const flood = yield* floodTab(proc, "mallory", 400)
      const t = yield* token({ sub: "mallory" })
      const id = yield* session(proc.url, t)
      const before = yield* memory(proc, inspector)

      const rss = yield* peakRss(proc.pid)
      const started = Date.now()
      yield* Flood.unreadCall(proc, t, id)
      const outcome = yield* Effect.raceFirst(
        Deferred.await(flood.cancelled),
        Effect.as(Deferred.await(flood.exhausted), "never cancelled: every progress message was taken")
      ).pipe(Effect.timeoutTo({ duration: "120 seconds", onSuccess: (o) => o, onTimeout: () => "no cancellation within 120 s" }))
      const seconds = (Date.now() - started) / 1000
      // With the attack still in place (the client's socket is open and unread).
      const during = yield* memory(proc, inspector)
      yield* rss.stop
      yield* Deferred.succeed(stop, undefined)
      yield* bob.done
      const figures = {
        outcome,
        seconds,
        heapBeforeMiB: mib(before.heap),
        heapAfterGcMiB: mib(during.heap),
        rssBeforeMiB: mib(before.rss),
        rssPeakMiB: mib(rss.peak()),
        rssAfterGcMiB: mib(during.rss),
        bystanderCalls: bob.seen.ok,
        cutsForBuffer: yield* cuts(proc, "buffer")
      }
      console.log(JSON.stringify({ unread: "POST tools/call with 1 MiB progress", ...figures }))

      expect(outcome).toMatch(/^slow consumer/)
      expect(figures.cutsForBuffer).toBe(1)
      expect(during.heap - before.heap).toBeLessThan(32 * MiB)
      expect(during.rss - before.rss).toBeLessThan(64 * MiB)
      expect(bob.seen.failures).toEqual([])
      expect(bob.seen.ok).toBeGreaterThan(0)
      // Only the request was cut: the session answers its next one.
      const list = yield* post(proc.url, t, { jsonrpc: "2.0", id: 8, method: "tools/list" }, id)
      expect(list.status).toBe(200)
      expect(list.text).toContain(Flood.FLOOD_TOOL)
    }), { timeout: 300_000 })

  it.scopedLive("a response whose bytes stop moving for EDGE_HTTP_WRITE_STALL is cut the same way, under a bound it never reaches", () =>
    Effect.gen(function*() {
      const proc = yield* Processes.allInOne({
        namespace: namespace(),
        env: { LOG_LEVEL: "info", ...LONG_CALLS, EDGE_OUTBOUND_HWM: String(1024 * MiB), EDGE_HTTP_WRITE_STALL: "1 second" }
      })
      // Enough to fill the kernel's buffers between the two ends, so that bytes wait at the edge.
      const flood = yield* floodTab(proc, "mallory", 40)
      const t = yield* token({ sub: "mallory" })
      const id = yield* session(proc.url, t)
      yield* Flood.unreadCall(proc, t, id)
      const outcome = yield* Effect.raceFirst(
        Deferred.await(flood.cancelled),
        // Every message taken, then the stall's second and plenty: the cut may come after the last
        // write, and on a busy machine the 40 MiB are still on their way through the process 10 s
        // after the tab sent them (a landing run).
        Effect.as(Effect.zipRight(Deferred.await(flood.exhausted), Effect.sleep("60 seconds")), "never cancelled: 60 s after the last progress message")
      )
      expect(outcome).toMatch(/^stalled/)
      expect(yield* cuts(proc, "stall")).toBe(1)
      expect(yield* cuts(proc, "buffer")).toBe(0)
    }), { timeout: 180_000 })

  it.scopedLive("a GET stream nobody reads is cut at EDGE_OUTBOUND_HWM while its session pushes, the session is told, and it goes on with a new stream", () =>
    Effect.gen(function*() {
      // In this process, to play the session's side of the bus: a list_changed is 60 bytes, and
      // the registry folds a burst of tool changes into one, so a tab cannot push past the few
      // MiB the kernel's socket buffers take at this pace. The session's pushes reach the edge as
      // these deliveries; the edge, its socket and the registry are real.
      const ctx = yield* Layer.build(stack(busLayer(), { services: Registry.layer, env: { EDGE_OUTBOUND_HWM: String(MiB) } }))
      const edge = Context.get(ctx, Edge.EdgeServer)
      const bus = Context.get(ctx, Bus.Bus)
      const proc = { url: edge.url, ws: edge.url.replace("http", "ws"), port: edge.port }
      const t = yield* token({ sub: "mallory" })
      const id = yield* session(proc.url, t)
      const controls = yield* Queue.unbounded<{ readonly op: string; readonly exchange: string }>()
      yield* bus.subscribe(Subjects.conn("registry", Subjects.ConnId(id)), (m) => {
        const op = m.header(Subjects.Header.httpOp)
        const exchange = m.header(Subjects.Header.http)
        if (op !== undefined && exchange !== undefined) Queue.unsafeOffer(controls, { op, exchange })
      })
      const before = yield* liveHeap
      yield* Flood.unreadRequest(proc.port, `GET /hub HTTP/1.1\r\nAuthorization: Bearer ${t}\r\nAccept: text/event-stream\r\nMcp-Session-Id: ${id}\r\nMCP-Protocol-Version: ${VERSION}\r\n`)
      const opened = yield* Queue.take(controls)
      expect(opened.op).toBe("stream")

      // 64 MiB of events, as a session would push them, to a client that reads none.
      const event = JSON.stringify({ jsonrpc: "2.0", method: "notifications/message", params: { level: "info", data: "x".repeat(MiB) } })
      for (let i = 1; i <= 64; i++) {
        bus.unsafePublish(Subjects.edgeOut(Subjects.EdgeId(edge.id)), event, {
          [Subjects.Header.op]: "deliver",
          [Subjects.Header.conn]: id,
          [Subjects.Header.http]: opened.exchange,
          [Subjects.Header.eventId]: `e.${i}`
        })
        yield* Effect.sleep("5 millis")
      }
      const closed = yield* Queue.take(controls).pipe(Effect.timeoutTo({ duration: "10 seconds", onSuccess: (c) => c.op, onTimeout: () => "no stream-closed within 10 s" }))
      const during = yield* liveHeap
      const cutsForBuffer = yield* cuts(proc, "buffer")
      console.log(JSON.stringify({ unread: "GET stream, 64 × 1 MiB pushed", closed, heapBeforeMiB: mib(before), heapAfterGcMiB: mib(during), cutsForBuffer }))
      expect(closed).toBe("stream-closed")
      expect(cutsForBuffer).toBe(1)
      expect(during - before).toBeLessThan(16 * MiB)

      // The cut stream let go of its session: a new one opens, and takes the next change.
      const stream = yield* sseStream(proc.url, t, id, VERSION)
      yield* tab(proc.ws, page("later", ["t"]), { user: "mallory", tabId: 2, url: "https://later.example.com/" })
      expect(JSON.parse((yield* stream.next).data)).toEqual({ jsonrpc: "2.0", method: "notifications/tools/list_changed" })
    }))

  it.scopedLive("a JSON answer its client never reads is cut once its bytes stop moving for EDGE_HTTP_WRITE_STALL", () =>
    Effect.gen(function*() {
      const ctx = yield* Layer.build(stack(busLayer(), { services: Registry.layer, env: { EDGE_HTTP_WRITE_STALL: "1 second" } }))
      const edge = Context.get(ctx, Edge.EdgeServer)
      // Twice what the kernel's socket buffers take between the two ends, so that most of it waits at the edge.
      const server = new McpServer({ name: "big", version: "1.0.0" })
      server.registerTool("big", { inputSchema: {} }, () => Promise.resolve({ content: [{ type: "text" as const, text: "z".repeat(8 * MiB) }] }))
      yield* tab(edge.url.replace("http", "ws"), server, { user: "mallory", tabId: 1, url: "https://big.example.com/" })
      const t = yield* token({ sub: "mallory" })
      const id = yield* session(edge.url, t)
      yield* Flood.unreadRequest(
        edge.port,
        `POST /hub HTTP/1.1\r\nAuthorization: Bearer ${t}\r\nContent-Type: application/json\r\nAccept: ${BOTH}\r\nMcp-Session-Id: ${id}\r\nMCP-Protocol-Version: ${VERSION}\r\n`,
        JSON.stringify({ jsonrpc: "2.0", id: 7, method: "tools/call", params: { name: "website_tool_big_example_com_tab1_big", arguments: {} } })
      )
      const stalled = yield* cuts({ url: edge.url }, "stall").pipe(
        Effect.filterOrFail((n) => n > 0),
        Effect.retry(Schedule.spaced("100 millis").pipe(Schedule.upTo("15 seconds"))),
        Effect.orElseSucceed(() => 0)
      )
      expect(stalled).toBe(1)
      expect(yield* cuts({ url: edge.url }, "buffer")).toBe(0)
    }))

  it.scopedLive("a client that reads gets an answer larger than EDGE_OUTBOUND_HWM, as JSON and as SSE after progress", () =>
    Effect.gen(function*() {
      const ctx = yield* Layer.build(stack(busLayer(), { services: Registry.layer, env: { EDGE_OUTBOUND_HWM: String(64 * 1024) } }))
      const edge = Context.get(ctx, Edge.EdgeServer)
      const big = "y".repeat(MiB)
      // The bound is the tab's socket's too, so the tab gets small calls; its answers are large.
      const server = new McpServer({ name: "big", version: "1.0.0" })
      server.registerTool("big", { inputSchema: {} }, async (_args, extra) => {
        const progressToken = extra._meta?.progressToken
        if (progressToken !== undefined) await extra.sendNotification({ method: "notifications/progress", params: { progressToken, progress: 1 } })
        return { content: [{ type: "text" as const, text: big }] }
      })
      yield* tab(edge.url.replace("http", "ws"), server, { user: "alice", tabId: 1, url: "https://big.example.com/" })
      const t = yield* token({ sub: "alice" })
      const client = yield* Effect.acquireRelease(
        Effect.promise(async () => {
          const c = new Client({ name: "reader", version: "0.0.0" })
          await c.connect(new StreamableHTTPClientTransport(new URL(`${edge.url}/hub`), { requestInit: { headers: { Authorization: `Bearer ${t}` } } }))
          return c
        }),
        (c) => Effect.promise(() => c.close())
      )
      const [tool] = yield* toolsUntil(client, (names) => names.length === 1)
      const name = tool?.name ?? ""
      expect(textOf(yield* Effect.promise(() => client.callTool({ name, arguments: {} })))).toBe(big)
      const progress: Array<number> = []
      const streamed = yield* Effect.promise(() => client.callTool({ name, arguments: {} }, undefined, { onprogress: (p) => void progress.push(p.progress) }))
      expect(textOf(streamed)).toBe(big)
      expect(progress).toEqual([1])
      expect(yield* cuts({ url: edge.url }, "buffer")).toBe(0)
    }))
})
