/**
 * The `cdp` suite: a `Runtime.evaluate` round trip in a page of the user's browser, through
 * Switchboard's CDP endpoint (`/cdp/{extension_id}`: client → edge → router → edge → the
 * extension's socket → `chrome.debugger`, and back) against direct CDP to the same Chromium
 * (`--remote-debugging-port`) and against the extension's own floor (its service worker straight
 * to `chrome.debugger`), in the same run: 1×1 for latency, 1×10 for what one client's
 * commands in flight get. A browser's debugger serves one tab's commands in order, so more clients
 * would measure Chromium, not the path.
 */
import { buildExtension } from "@switchboard/extension/build"
import { Keys } from "@switchboard/extension/keys"
import * as Effect from "effect/Effect"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { Worker } from "playwright-core"
import { type WebSocket } from "ws"
import { launch } from "../src/support/Browser.ts"
import { freePort } from "../src/support/FreePort.ts"
import { open, run, type Shape } from "./load.ts"
import { measureWith, SECONDS, WARMUP } from "./measure.ts"
import { type Groups, issueToken, Ready, startService, unlimited } from "./processes.ts"
import { report, type ThroughputLine } from "./report.ts"

const HOPS: Readonly<Record<string, string>> = {
  "direct-cdp": "client-chromium",
  "extension-floor": "service worker-chromium",
  "switchboard-embedded": "client-edge-router-edge-extension-chromium"
}

const SHAPES: ReadonlyArray<readonly [string, Shape]> = [
  ["1x1", { clients: 1, inFlight: 1 }],
  ["1x10", { clients: 1, inFlight: 10 }]
]

/** Sends one CDP command on a socket and waits for its answer (setup only: the loop does its own). */
const command = (ws: WebSocket, id: number, method: string, params: object = {}) =>
  new Promise<Record<string, unknown>>((resolve, reject) => {
    const onMessage = (data: Buffer) => {
      const m = JSON.parse(String(data)) as Record<string, unknown>
      if (m["id"] !== id) return
      ws.off("message", onMessage)
      if (m["error"] !== undefined) reject(new Error(`${method}: ${JSON.stringify(m["error"])}`))
      else resolve((m["result"] ?? {}) as Record<string, unknown>)
    }
    ws.on("message", onMessage)
    ws.send(JSON.stringify({ id, method, params }))
  })

/** Opens a page on a browser-level CDP socket and attaches to it (flattened); its session id. */
const pageSession = async (ws: WebSocket) => {
  const { targetId } = await command(ws, -1, "Target.createTarget", { url: "about:blank" })
  const { sessionId } = await command(ws, -2, "Target.attachToTarget", { targetId, flatten: true })
  if (typeof sessionId !== "string") throw new Error("Target.attachToTarget gave no session")
  return sessionId
}

const isAnswer = (data: Buffer) => data.subarray(0, 6).toString() === "{\"id\":"

/** Every shape of `Runtime.evaluate` against the browser-level CDP socket at `url`. */
const measureTarget = (name: string, url: string, groups: Groups) => {
  // One socket per shape: the load opens it, and its page session is made before the loop.
  let session = ""
  return measureWith("cdp", name, groups, (load, onWindow) =>
    run({
      url,
      shape: load,
      seconds: SECONDS,
      warmupSeconds: WARMUP,
      setup: async (ws) => void (session = await pageSession(ws)),
      frame: (n) => `{"id":${n},"method":"Runtime.evaluate","params":{"expression":"${n}+1"},"sessionId":"${session}"}`,
      isReply: isAnswer,
      onWindow
    }), SHAPES)
}

interface WorkerGlobals {
  readonly chrome: {
    readonly storage: { readonly local: { set(items: Record<string, string>): Promise<void> } }
    readonly tabs: { create(p: { url: string; active: boolean }): Promise<{ id?: number }>; remove(id: number): Promise<void> }
    readonly debugger: {
      attach(t: { tabId: number }, v: string): Promise<void>
      detach(t: { tabId: number }): Promise<void>
      sendCommand(t: { tabId: number }, method: string, params: object): Promise<unknown>
    }
  }
}

/**
 * The extension's own floor: the same command from its service worker straight to
 * `chrome.debugger`, with no socket at all, in a tab of its own. What is left of the endpoint's
 * latency above this is Switchboard's and the extension socket's.
 */
const extensionFloor = (worker: Worker) =>
  // tsx names the inner functions of what is evaluated with a `__name` helper the worker lacks.
  Effect.promise(() => worker.evaluate("globalThis.__name = (f) => f")).pipe(Effect.zipRight(Effect.forEach(SHAPES, ([shape, { inFlight }]) =>
    Effect.promise(() =>
      worker.evaluate(async ({ inFlight, seconds, warmup }) => {
        const { debugger: d, tabs } = (globalThis as unknown as WorkerGlobals).chrome
        const tab = await tabs.create({ url: "about:blank", active: false })
        const tabId = tab.id ?? -1
        await d.attach({ tabId }, "1.3")
        const latencies: Array<number> = []
        let measuring = false
        let stopped = false
        let n = 0
        const loop = async () => {
          while (!stopped) {
            const t0 = performance.now()
            await d.sendCommand({ tabId }, "Runtime.evaluate", { expression: `${n++}+1` })
            if (measuring) latencies.push((performance.now() - t0) * 1000)
          }
        }
        const loops = Array.from({ length: inFlight }, loop)
        await new Promise((r) => setTimeout(r, warmup * 1000))
        measuring = true
        const start = performance.now()
        await new Promise((r) => setTimeout(r, seconds * 1000))
        measuring = false
        const elapsed = (performance.now() - start) / 1000
        stopped = true
        await Promise.all(loops)
        await d.detach({ tabId })
        await tabs.remove(tabId)
        const sorted = latencies.sort((a, b) => a - b)
        const at = (p: number) => Math.round(sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? 0)
        return { msgs_per_s: Math.round(latencies.length / elapsed), p50_us: at(50), p99_us: at(99) }
      }, { inFlight, seconds: SECONDS, warmup: WARMUP })
    ).pipe(Effect.map((r): ThroughputLine => ({ suite: "cdp", target: "extension-floor", shape, ...r })))
  )))

export const cdpSuite = Effect.scoped(Effect.gen(function*() {
  const dir = yield* Effect.acquireRelease(
    Effect.promise(() => mkdtemp(join(tmpdir(), "sb-bench-extension-"))),
    (d) => Effect.promise(() => rm(d, { recursive: true, force: true }))
  )
  yield* Effect.promise(() => buildExtension(dir))
  const debugPort = yield* freePort
  const context = yield* launch({ args: [`--disable-extensions-except=${dir}`, `--load-extension=${dir}`, `--remote-debugging-port=${debugPort}`] })
  const worker = context.serviceWorkers()[0] ?? (yield* Effect.promise(() => context.waitForEvent("serviceworker", { timeout: 10_000 })))

  const server = yield* startService("all-in-one", "services/all-in-one/src/main.ts", unlimited, [Ready.edge, Ready.router])
  const user = "bench-cdp"
  const token = yield* issueToken({ sub: user, ttl: "1 hour" })
  yield* Effect.promise(() =>
    worker.evaluate((items) => (globalThis as unknown as WorkerGlobals).chrome.storage.local.set(items), {
      [Keys.serverUrl]: `http://127.0.0.1:${server.port}`,
      [Keys.token]: token
    })
  )
  // The proxy's id of the extension, once it has connected.
  const extensionId = yield* Effect.tryPromise(async () => {
    const mcp = await open(`ws://127.0.0.1:${server.port}/mcp`)
    try {
      await command(mcp, 1, "mcp_handshake", { accessToken: token })
      for (let i = 0; i < 300; i++) {
        const { extensions } = (await command(mcp, 2 + i, "list_extensions")) as { extensions?: Array<{ id: string }> }
        const id = extensions?.[0]?.id
        if (id !== undefined) return id
        await new Promise((r) => setTimeout(r, 100))
      }
      throw new Error("the extension never connected")
    } finally {
      mcp.terminate()
    }
  })

  const direct = yield* Effect.tryPromise(async () => {
    const res = await fetch(`http://127.0.0.1:${debugPort}/json/version`)
    return ((await res.json()) as { webSocketDebuggerUrl: string }).webSocketDebuggerUrl
  })
  const lines = [
    ...(yield* measureTarget("direct-cdp", direct, [])),
    ...(yield* extensionFloor(worker)),
    ...(yield* measureTarget("switchboard-embedded", `ws://127.0.0.1:${server.port}/cdp/${extensionId}?token=${token}`, [["server", [server]]]))
  ].map((l) => ({ ...l, hops: HOPS[l.target] ?? "" }))
  report(lines, { ratio_to_direct: "direct-cdp" }, { p50_ratio_to_direct: "direct-cdp" })
}))
