/**
 * The idle suite: resident memory per idle authenticated socket, on each of /extension, /mcp,
 * /hub, /tabs and /v0/ws, for the all-in-one and for every process of the distributed deployment
 * (one edge, auth, router, registry, broker and NATS), against a plain `ws` server in the same run.
 *
 * Every path gets fresh processes: memory freed by one path's sockets would otherwise be reused by
 * the next path's and hide part of its cost. Each process is measured after a full GC (through
 * the inspector, since the services have no admin hook), once after a warm-up of WARM sockets and
 * once after SOCKETS more; a socket costs the difference over SOCKETS. The sockets are this
 * process's, on 127.0.0.1, so that the servers' RSS is their own.
 */
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import { readFileSync, writeFileSync } from "node:fs"
import { createServer } from "node:net"
import { WebSocket } from "ws"
import { answer, isId, parseRecord } from "./frames.ts"
import { issueToken, type Measured, natsProcess, Ready, startServer, startService, type Started, unlimited, withNats, wsUrl } from "./processes.ts"
import { print, round1 } from "./report.ts"

/** Sockets measured on each path (IDLE_SOCKETS=500 for a quick run). */
const SOCKETS = Number(process.env["IDLE_SOCKETS"] ?? 10_000)
/**
 * Opened before the first measurement and kept open (IDLE_WARM, default 100): the first sockets of
 * a path also pay for code compiled and state created once (a topic, a KV watch), which is not a
 * per-socket cost; with IDLE_STARTUP_GC=1, a warm-up of a thousand also grows the young generation
 * back before the first reading.
 */
const WARM = Number(process.env["IDLE_WARM"] ?? 100)
/**
 * Sockets per user (IDLE_SOCKETS_PER_USER, default 10). With 1, every socket also pays for what is
 * kept per user: on /hub that was 183 KB in the registry and 181 KB in NATS per socket (at 10,
 * 43 and 23 KB), which is a per-user cost, and it halves the rate at which /hub sockets open.
 */
const PER_USER = Math.max(1, Number(process.env["IDLE_SOCKETS_PER_USER"] ?? 10))
/** /v0/ws participants per topic; each topic's setup is shared by this many sockets. */
const TOPIC_SIZE = Number(process.env["IDLE_TOPIC_SIZE"] ?? 20)
/**
 * Which targets and paths to measure (IDLE_TARGETS=plain,embedded,distributed and
 * IDLE_PATHS=/hub,/tabs; all by default): a change to one service is iterated on against the
 * target and path it affects, in a fraction of the full suite's minutes.
 */
const listed = (name: string) => process.env[name]?.split(",").map((s) => s.trim()).filter((s) => s !== "")
const TARGETS = listed("IDLE_TARGETS")
const PATHS = listed("IDLE_PATHS")
const wantedTarget = (name: string) => TARGETS === undefined || TARGETS.includes(name)
/**
 * IDLE_HEAP_SNAPSHOTS=<dir>: each inspected process also writes a heap snapshot there after each
 * measurement (`<target>-<path>-<process>-before|after.heapsnapshot`), to compare by constructor.
 */
const SNAPSHOTS = process.env["IDLE_HEAP_SNAPSHOTS"]
/**
 * IDLE_ALLOCATIONS=<dir>: each inspected process also writes a sampling allocation profile of the
 * measured sockets' handshakes there (`<target>-<path>-<process>-<kind>.heapprofile`), of the kind
 * IDLE_ALLOCATIONS_KIND names: `promoted` (the default) keeps the samples of objects that a full
 * GC collected, `live` only those still alive, `all` every allocation. A full GC also collects
 * the young generation's garbage, so `promoted` less `live` is what outlived a scavenge and young
 * garbage that a full GC happened to find; `all` says what a handshake allocates in all, which sets
 * how often scavenges come, and so how much of what lives for a handshake's round trips is promoted.
 */
const ALLOCATIONS = process.env["IDLE_ALLOCATIONS"]
/**
 * Full GCs before each reading (IDLE_GCS, default 1). One GC compacts only so many fragmented
 * pages (V8 bounds what one compaction moves), so committed heap, and RSS, may keep shrinking over
 * a few more, as they do in a process left idle, whose memory reducer collects again.
 */
const GCS = Math.max(0, Number(process.env["IDLE_GCS"] ?? 1))
/**
 * IDLE_STARTUP_GC=1 (with IDLE_GCS=0): one full GC before the warm-up, the readings still unforced.
 * A process started with --enable-source-maps holds about 30 MB of garbage from parsing its map
 * (plain ws: 99.5 MB of heap in use, 69.8 MB after a GC), which the first major GC among the
 * measured sockets collects, so that it is subtracted from their cost: 3 KB a socket at 10,000
 * (plain ws read 0.8 KB). But that GC also shrinks the young generation, which the measured
 * handshakes then grow back to its 16 MB semi-spaces: a fixed cost that lands in the difference
 * (`new_space_kb_per_socket`). Off by default, so that unforced readings compare with earlier runs.
 */
const STARTUP_GC = GCS === 0 && process.env["IDLE_STARTUP_GC"] === "1"
/** Handshakes in flight at once: paced, so that a path measures memory and not a queue of upgrades. */
const IN_FLIGHT = 100
const SOCKET_TIMEOUT_MS = 20_000
/** Opening stops after this long, and the path reports the sockets it got. */
const OPEN_DEADLINE_MS = Number(process.env["IDLE_OPEN_SECONDS"] ?? 60) * 1000
/** Failed handshakes after which a path stops opening: its caps or timeouts are what it measures. */
const MAX_FAILED = 50
/** Time for work a handshake sets off (KV writes, presence fan-out) to finish before RSS is read. */
const SETTLE_MS = Number(process.env["IDLE_SETTLE_SECONDS"] ?? 2) * 1000

/** Caps sized for people, lifted: every socket comes from 127.0.0.1, and a user may have many. */
const lifted = {
  ...unlimited,
  EDGE_MAX_CONNECTIONS_PER_ADDRESS: "0",
  EDGE_MAX_CONNECTIONS_PER_USER: "0",
  ROUTER_MAX_CLIENTS_PER_USER: "1000000000",
  ROUTER_MAX_EXTENSIONS_PER_USER: "1000000000",
  MCPX_MAX_PARTICIPANTS: "1000000"
} as const

// --- sockets -------------------------------------------------------------------------------

/** How one path's socket authenticates: its URL, what it sends once open, and the frame that ends the handshake. */
interface Handshake {
  readonly path: string
  readonly query: (i: number, token: string) => string
  /** Sends the first frames; true when the open socket is all there is to it (plain ws). */
  readonly onOpen: (ws: WebSocket, i: number, token: string) => boolean
  /** True once the socket is authenticated; may answer the server (the extension's `authenticate`). */
  readonly onFrame: (m: Record<string, unknown>, ws: WebSocket, token: string) => boolean
}

const request = (ws: WebSocket, id: string, method: string, params: Record<string, unknown>) => {
  ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }))
  return false
}
const wait = () => false
const answered = (m: Record<string, unknown>, id: string) => m["id"] === id && "result" in m
const withToken = (_i: number, token: string) => `?token=${encodeURIComponent(token)}`

const allHandshakes: ReadonlyArray<Handshake> = [
  {
    // The proxy asks first; the extension answers with its name and token, then is told its id.
    path: "/extension",
    query: () => "",
    onOpen: wait,
    onFrame: (m, ws, token) => {
      if (m["method"] === "authenticate" && isId(m["id"])) ws.send(answer(m["id"], { name: "Bench", accessToken: token }))
      return m["method"] === "authenticated"
    }
  },
  {
    path: "/mcp",
    query: () => "",
    onOpen: (ws, _i, token) => request(ws, "h", "mcp_handshake", { accessToken: token }),
    onFrame: (m) => answered(m, "h")
  },
  {
    path: "/hub",
    query: withToken,
    onOpen: (ws) => request(ws, "i", "initialize", { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "bench", version: "0" } }),
    onFrame: (m, ws) => {
      if (!answered(m, "i")) return false
      ws.send(JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }))
      return true
    }
  },
  {
    // hello as a request, so that its answer says the tab is registered.
    path: "/tabs",
    query: withToken,
    onOpen: (ws, i) => request(ws, "h", "browser/hello", { tabId: i, url: `https://t${i}.idle.example.com/` }),
    onFrame: (m) => answered(m, "h")
  },
  {
    path: "/v0/ws",
    query: (i, token) => `?topic=idle-${Math.floor(i / TOPIC_SIZE)}&token=${encodeURIComponent(token)}`,
    onOpen: wait,
    onFrame: (m) => {
      const payload = m["payload"]
      return typeof payload === "object" && payload !== null && (payload as Record<string, unknown>)["event"] === "welcome"
    }
  }
]

const handshakes = allHandshakes.filter((h) => PATHS === undefined || PATHS.includes(h.path))

/** No handshake: what a plain `ws` server holds. */
const plainHandshake: Handshake = { path: "/", query: () => "", onOpen: () => true, onFrame: () => true }

/** The socket once `handshake` says it is authenticated; refused on an error frame, a close or the timeout. */
const idleSocket = (base: string, handshake: Handshake, i: number, token: string, onIdleClose: () => void) =>
  new Promise<WebSocket>((resolve, reject) => {
    const ws = new WebSocket(`${base}${handshake.path}${handshake.query(i, token)}`, { perMessageDeflate: false })
    let done = false
    const fail = (why: string) => {
      if (done) return
      done = true
      clearTimeout(timer)
      ws.terminate()
      reject(new Error(`${handshake.path} socket ${i}: ${why}`))
    }
    const timer = setTimeout(() => fail(`not authenticated within ${SOCKET_TIMEOUT_MS / 1000} s`), SOCKET_TIMEOUT_MS)
    const onMessage = (data: Buffer) => {
      const m = parseRecord(data)
      if (m === undefined || done) return
      if ("error" in m || (typeof m["payload"] === "object" && data.includes(`"event":"error"`))) return fail(`refused: ${data.toString().slice(0, 300)}`)
      if (handshake.onFrame(m, ws, token)) settle()
    }
    const settle = () => {
      done = true
      clearTimeout(timer)
      // Idle from here: later frames (keepalives, presence) are read by ws and dropped.
      ws.off("message", onMessage)
      resolve(ws)
    }
    ws.on("message", onMessage)
    ws.once("open", () => {
      if (handshake.onOpen(ws, i, token)) settle()
    })
    ws.on("error", (e) => fail(e.message))
    ws.once("close", (code, reason) => {
      if (done) return onIdleClose()
      fail(`closed ${code} ${reason.toString()}`)
    })
  })

interface Opened {
  readonly sockets: Array<WebSocket>
  failed: number
  firstError: string | undefined
  seconds: number
}

/** Sockets `from` to `from + count - 1`, IN_FLIGHT handshakes at a time, until done, the deadline or MAX_FAILED. */
const openSockets = async (
  base: string,
  handshake: Handshake,
  tokens: ReadonlyArray<string>,
  from: number,
  count: number,
  onIdleClose: () => void
): Promise<Opened> => {
  const opened: Opened = { sockets: [], failed: 0, firstError: undefined, seconds: 0 }
  const start = performance.now()
  const deadline = start + OPEN_DEADLINE_MS
  let next = from
  const worker = async () => {
    while (next < from + count && performance.now() < deadline && opened.failed < MAX_FAILED) {
      const i = next++
      try {
        opened.sockets.push(await idleSocket(base, handshake, i, tokens[i % tokens.length] ?? "", onIdleClose))
      } catch (e) {
        opened.failed++
        opened.firstError ??= e instanceof Error ? e.message : String(e)
      }
    }
  }
  await Promise.all(Array.from({ length: IN_FLIGHT }, worker))
  opened.seconds = (performance.now() - start) / 1000
  return opened
}

/**
 * Users for `sockets`: socket i is user i mod users, so that the TOPIC_SIZE sockets of one /v0/ws
 * topic (consecutive) are distinct participants.
 */
const users = (sockets: number) => Math.max(TOPIC_SIZE, Math.ceil(sockets / PER_USER))

// --- memory of the servers ------------------------------------------------------------------

const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const server = createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as { port: number }
      server.close(() => resolve(port))
    })
  })

/** Node flags that open an inspector on `port` (its URL not printed), for the GC below. */
const inspectEnv = (port: number) => ({
  NODE_OPTIONS: `${process.env["NODE_OPTIONS"] ?? ""} --inspect=127.0.0.1:${port} --inspect-publish-uid=http`.trim()
})

/** A DevTools protocol session with one Node process, to force a full GC and read its heap. */
interface Inspector {
  readonly call: (method: string, params?: Record<string, unknown>) => Promise<Record<string, unknown>>
  /** Writes a heap snapshot to `file` (see IDLE_HEAP_SNAPSHOTS). */
  readonly snapshot: (file: string) => Promise<void>
  readonly close: () => void
}

const inspect = async (port: number): Promise<Inspector> => {
  const targets: unknown = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json()
  const first: unknown = Array.isArray(targets) ? targets[0] : undefined
  const url = typeof first === "object" && first !== null ? (first as Record<string, unknown>)["webSocketDebuggerUrl"] : undefined
  if (typeof url !== "string") throw new Error(`no inspector target on port ${port}`)
  const ws = await new Promise<WebSocket>((resolve, reject) => {
    const s = new WebSocket(url, { perMessageDeflate: false, maxPayload: 256 * 1024 * 1024 })
    s.once("open", () => resolve(s))
    s.once("error", reject)
  })
  const waiting = new Map<number, (m: Record<string, unknown>) => void>()
  /** The chunks of the heap snapshot being taken, which arrive as events before its answer. */
  let chunks: Array<string> | undefined
  ws.on("message", (data: Buffer) => {
    const m = parseRecord(data)
    const id = m?.["id"]
    if (m?.["method"] === "HeapProfiler.addHeapSnapshotChunk") {
      const params = m["params"]
      const chunk = typeof params === "object" && params !== null ? (params as Record<string, unknown>)["chunk"] : undefined
      if (typeof chunk === "string") chunks?.push(chunk)
      return
    }
    if (m === undefined || typeof id !== "number") return
    waiting.get(id)?.(m)
    waiting.delete(id)
  })
  let n = 0
  const call = (method: string, params: Record<string, unknown> = {}) =>
    new Promise<Record<string, unknown>>((resolve, reject) => {
      const id = ++n
      // A snapshot of a heap of hundreds of MB takes a while.
      const timer = setTimeout(() => reject(new Error(`${method}: no answer within 120 s`)), 120_000)
      waiting.set(id, (m) => {
        clearTimeout(timer)
        const result = m["result"]
        if (typeof result === "object" && result !== null) resolve(result as Record<string, unknown>)
        else reject(new Error(`${method} failed: ${JSON.stringify(m)}`))
      })
      ws.send(JSON.stringify({ id, method, params }))
    })
  return {
    call,
    snapshot: async (file) => {
      chunks = []
      await call("HeapProfiler.takeHeapSnapshot", { reportProgress: false })
      writeFileSync(file, chunks.join(""))
      chunks = undefined
    },
    close: () => ws.terminate()
  }
}

/** A process whose memory is measured, with its inspector when it has one (NATS has none). */
interface Subject {
  readonly process: Measured
  readonly inspector: Inspector | undefined
}

const rssKb = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? NaN)

/**
 * The resident KB of a process's main malloc heap (`[heap]` in its smaps), NaN where there is no
 * such file. What its native objects take (a TCP socket's handle and wrap, about 0.6 KB) comes from
 * here, and only grows RSS when its free space runs out: the plain `ws` server's startup left 10 MB
 * of it free, which hid what its sockets take (issue 29).
 */
const mallocKb = (pid: number) => {
  try {
    const smaps = readFileSync(`/proc/${pid}/smaps`, "utf8")
    const at = smaps.indexOf("[heap]\n")
    return at < 0 ? 0 : Number(/Rss:\s+(\d+) kB/.exec(smaps.slice(at))?.[1] ?? NaN)
  } catch {
    return NaN
  }
}

interface Memory {
  readonly rssKb: number
  /** Of `rssKb`, the main malloc heap's (see `mallocKb`). */
  readonly mallocKb: number
  /** V8 heap in use after the GC, in KB; NaN without an inspector. */
  readonly heapKb: number
  /**
   * What explains RSS beyond the live heap (`process.memoryUsage()` after the GC, in KB; NaN
   * without an inspector): the pages V8 keeps for its heap, used or not, and the memory outside it
   * that JS objects own (Buffers, ArrayBuffers). RSS beyond both is native: libuv handles, malloc.
   */
  readonly heapTotalKb: number
  readonly externalKb: number
  /**
   * Of `heapTotalKb`, the young generation's semi-spaces: V8 grows them (up to 16 MB each) while a
   * path's handshakes allocate fast, and keeps them. Not a per-socket cost, but in the difference.
   */
  readonly newSpaceKb: number
  /** Committed but unused bytes of each V8 space (KB): where the heap's slack is, after the GC. */
  readonly slackKb: Readonly<Record<string, number>>
}

/** `process.memoryUsage()` of an inspected process and its new space's size, as JSON. */
const usageExpression =
  `(() => { const spaces = process.getBuiltinModule("v8").getHeapSpaceStatistics(); return JSON.stringify({ ...process.memoryUsage(), newSpace: spaces.find((s) => s.space_name === "new_space")?.space_size, slack: Object.fromEntries(spaces.map((s) => [s.space_name.replace("_space", ""), s.space_size - s.space_used_size])) }) })()`

const delay = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** Each subject's memory after a full GC. */
const memory = async (subjects: ReadonlyArray<Subject>): Promise<Array<Memory>> => {
  await delay(SETTLE_MS)
  const none = { heapKb: NaN, heapTotalKb: NaN, externalKb: NaN, newSpaceKb: NaN, slackKb: {} }
  const heaps = await Promise.all(subjects.map(async ({ inspector }) => {
    if (inspector === undefined) return none
    for (let i = 0; i < GCS; i++) await inspector.call("HeapProfiler.collectGarbage")
    const usage = await inspector.call("Runtime.getHeapUsage")
    const evaluated = await inspector.call("Runtime.evaluate", { expression: usageExpression, returnByValue: true })
    const value: unknown = (evaluated["result"] as Record<string, unknown> | undefined)?.["value"]
    const node = typeof value === "string" ? parseRecord(Buffer.from(value)) : undefined
    return {
      heapKb: Number(usage["usedSize"]) / 1024,
      heapTotalKb: Number(node?.["heapTotal"] ?? NaN) / 1024,
      externalKb: Number(node?.["external"] ?? NaN) / 1024,
      newSpaceKb: Number(node?.["newSpace"] ?? NaN) / 1024,
      slackKb: Object.fromEntries(Object.entries(parseRecord(Buffer.from(JSON.stringify(node?.["slack"] ?? {}))) ?? {}).map(([k, v]) => [k, Number(v) / 1024]))
    }
  }))
  // RSS shrinks a moment after a GC, as V8 hands back the pages it emptied.
  await delay(500)
  return subjects.map((s, i) => ({ rssKb: rssKb(s.process.pid), mallocKb: mallocKb(s.process.pid), ...(heaps[i] ?? none) }))
}

// --- one path against fresh processes -------------------------------------------------------

/** Plain ws's per-socket RSS in this run, for every later line's ratio. */
let plainKbPerSocket: number | undefined

/**
 * The started processes (each on its own inspector port) and the edge URL; the first subject is
 * reported as the target's server, the others as extra lines.
 */
interface Deployment {
  readonly name: string
  readonly base: string
  readonly subjects: ReadonlyArray<Subject>
}

/** With IDLE_HEAP_SNAPSHOTS, a heap snapshot of every inspected process (after `memory`'s reading). */
const snapshots = async (deployment: Deployment, handshake: Handshake, when: string) => {
  if (SNAPSHOTS === undefined) return
  const path = handshake.path.replace(/[^a-z0-9]+/gi, "") || "root"
  for (const { process: p, inspector } of deployment.subjects) {
    await inspector?.snapshot(`${SNAPSHOTS}/${deployment.name}-${path}-${p.name.replace(/\W+/g, "")}-${when}.heapsnapshot`)
  }
}

/** With IDLE_ALLOCATIONS, starts or stops (and writes) every inspected process's sampling allocation profile. */
const sampling = async (deployment: Deployment, op: "start" | "stop", handshake?: Handshake) => {
  if (ALLOCATIONS === undefined) return
  const wanted = process.env["IDLE_ALLOCATIONS_KIND"]
  const kind = wanted === "live" || wanted === "all" ? wanted : "promoted"
  for (const { process: p, inspector } of deployment.subjects) {
    if (inspector === undefined) continue
    if (op === "start") {
      await inspector.call("HeapProfiler.startSampling", { samplingInterval: 8192, includeObjectsCollectedByMajorGC: kind !== "live", includeObjectsCollectedByMinorGC: kind === "all" })
      continue
    }
    const { profile } = await inspector.call("HeapProfiler.stopSampling")
    const path = (handshake?.path ?? "").replace(/[^a-z0-9]+/gi, "") || "root"
    writeFileSync(`${ALLOCATIONS}/${deployment.name}-${path}-${p.name.replace(/\W+/g, "")}-${kind}.heapprofile`, JSON.stringify(profile))
  }
}

const measurePath = (deployment: Deployment, handshake: Handshake, tokens: ReadonlyArray<string>) =>
  Effect.promise(async () => {
    let closedWhileIdle = 0
    const onIdleClose = () => closedWhileIdle++
    if (STARTUP_GC) await Promise.all(deployment.subjects.map(({ inspector }) => inspector?.call("HeapProfiler.collectGarbage")))
    const warm = await openSockets(deployment.base, handshake, tokens, 0, WARM, onIdleClose)
    const before = await memory(deployment.subjects)
    await snapshots(deployment, handshake, "before")
    await sampling(deployment, "start")
    const measured = await openSockets(deployment.base, handshake, tokens, WARM, SOCKETS, onIdleClose)
    const after = await memory(deployment.subjects)
    await sampling(deployment, "stop", handshake)
    await snapshots(deployment, handshake, "after")
    const sockets = measured.sockets.length
    for (const ws of [...warm.sockets, ...measured.sockets]) ws.terminate()
    const failed = warm.failed + measured.failed
    if (failed > 0) console.error(`idle: ${deployment.name} ${handshake.path}: ${failed} handshakes failed, the first: ${warm.firstError ?? measured.firstError}`)
    // Every process together as a last line, when there are several: what the deployment spends.
    const lines = deployment.subjects.map((subject, i) => [subject.process.name, subject.inspector !== undefined, before[i], after[i]] as const)
    const total = (ms: ReadonlyArray<Memory | undefined>, of: (m: Memory) => number) =>
      ms.reduce((t, m) => t + (m === undefined ? NaN : Number.isNaN(of(m)) ? 0 : of(m)), 0)
    const sum = (ms: ReadonlyArray<Memory | undefined>): Memory => ({
      rssKb: ms.reduce((t, m) => t + (m?.rssKb ?? NaN), 0),
      mallocKb: total(ms, (m) => m.mallocKb),
      heapKb: total(ms, (m) => m.heapKb),
      heapTotalKb: total(ms, (m) => m.heapTotalKb),
      externalKb: total(ms, (m) => m.externalKb),
      newSpaceKb: total(ms, (m) => m.newSpaceKb),
      slackKb: {}
    })
    if (lines.length > 1) lines.push(["all", false, sum(before), sum(after)])
    lines.forEach(([name, gc, b, a], i) => {
      if (a === undefined || b === undefined) return
      const rssPerSocket = sockets === 0 ? NaN : (a.rssKb - b.rssKb) / sockets
      if (handshake === plainHandshake) plainKbPerSocket = rssPerSocket
      const finite = (n: number) => (Number.isFinite(n) ? round1(n) : null)
      print({
        suite: "idle",
        target: deployment.name,
        path: handshake.path,
        process: name,
        sockets,
        users: Math.min(tokens.length, sockets + WARM),
        failed,
        closed_while_idle: closedWhileIdle,
        open_s: round1(measured.seconds),
        rss_before_mb: round1(b.rssKb / 1024),
        rss_after_mb: round1(a.rssKb / 1024),
        rss_kb_per_socket: finite(rssPerSocket),
        heap_kb_per_socket: finite(sockets === 0 ? NaN : (a.heapKb - b.heapKb) / sockets),
        heap_committed_kb_per_socket: finite(sockets === 0 ? NaN : (a.heapTotalKb - b.heapTotalKb) / sockets),
        new_space_kb_per_socket: finite(sockets === 0 ? NaN : (a.newSpaceKb - b.newSpaceKb) / sockets),
        external_kb_per_socket: finite(sockets === 0 ? NaN : (a.externalKb - b.externalKb) / sockets),
        malloc_before_mb: finite(b.mallocKb / 1024),
        malloc_kb_per_socket: finite(sockets === 0 ? NaN : (a.mallocKb - b.mallocKb) / sockets),
        // Only the spaces whose slack moved by at least 0.1 KB per socket.
        ...Object.fromEntries(
          Object.entries(a.slackKb)
            .map(([space, kb]) => [`heap_slack_${space}_kb_per_socket`, sockets === 0 ? NaN : round1((kb - (b.slackKb[space] ?? 0)) / sockets)] as const)
            .filter(([, kb]) => Math.abs(kb) >= 0.1)
        ),
        gc,
        ...(i === 0 && plainKbPerSocket !== undefined ? { ratio_to_plain: finite(rssPerSocket / plainKbPerSocket) } : {}),
        ...(handshake.path === "/v0/ws" ? { participants_per_topic: TOPIC_SIZE } : {})
      })
    })
  })

/** A process started with an inspector, and a session with it for as long as the scope lives. */
const inspected = (start: (env: Readonly<Record<string, string>>) => Effect.Effect<Started, Error, Scope.Scope>) =>
  Effect.gen(function*() {
    const port = yield* Effect.promise(freePort)
    const started = yield* start(inspectEnv(port))
    const inspector = yield* Effect.acquireRelease(
      Effect.tryPromise(() => inspect(port)).pipe(
        Effect.orElse(() => {
          console.error(`idle: no inspector for ${started.name}; its RSS is read without a forced GC`)
          return Effect.succeed(undefined)
        })
      ),
      (i) => Effect.sync(() => i?.close())
    )
    return { started, subject: { process: started, inspector } satisfies Subject }
  })

const plainTarget = (tokens: ReadonlyArray<string>) =>
  Effect.scoped(Effect.gen(function*() {
    const { started, subject } = yield* inspected((env) => startServer("plain", env))
    yield* measurePath({ name: "plain-ws", base: wsUrl(started, ""), subjects: [subject] }, plainHandshake, tokens)
  }))

const embeddedTarget = (tokens: ReadonlyArray<string>) =>
  Effect.forEach(handshakes, (handshake) =>
    Effect.scoped(Effect.gen(function*() {
      const { started, subject } = yield* inspected((env) =>
        startService("all-in-one", "services/all-in-one/src/main.ts", { ...lifted, ...env }, [Ready.edge, Ready.router, Ready.broker, Ready.registry])
      )
      yield* measurePath({ name: "switchboard-embedded", base: wsUrl(started, ""), subjects: [subject] }, handshake, tokens)
    })), { discard: true })

const distributedTarget = (tokens: ReadonlyArray<string>) =>
  // A NATS per path too: JetStream keeps what a path stored (and its RSS) after the path's processes end.
  Effect.forEach(handshakes, (handshake, n) =>
    withNats((natsUrl) =>
      Effect.scoped(Effect.gen(function*() {
        // A namespace per path, so that no KV record of the previous path's processes is seen.
        const env = { ...lifted, NATS_URL: natsUrl, SWITCHBOARD_NAMESPACE: `bench${process.pid}i${n}` }
        const service = (name: string, main: string, ready: RegExp) =>
          inspected((inspect) => startService(name, `services/${main}/src/main.ts`, { ...env, ...inspect }, [ready]))
        // The edge first: the edge and the actor hosts open the `edges` bucket with different
        // options, and two first-time creators racing make one of them fail to start.
        const edge = yield* service("edge", "edge", Ready.edge)
        const others = yield* Effect.all(
          [
            service("auth", "auth", Ready.auth),
            service("router", "router", Ready.router),
            service("registry", "registry", Ready.registry),
            service("broker", "broker", Ready.broker)
          ],
          { concurrency: "unbounded" }
        )
        const nats = natsProcess(natsUrl)
        const subjects: Array<Subject> = [edge.subject, ...others.map((o) => o.subject)]
        if (nats !== undefined) subjects.push({ process: nats, inspector: undefined })
        yield* measurePath({ name: "switchboard-distributed", base: wsUrl(edge.started, ""), subjects }, handshake, tokens)
      }))), { discard: true })

export const idleSuite = Effect.gen(function*() {
  const start = performance.now()
  // One user per socket; the same tokens on every target, each path on fresh processes.
  const tokens = yield* Effect.forEach(
    Array.from({ length: users(WARM + SOCKETS) }, (_, i) => i),
    (i) => issueToken({ sub: `idle${i}`, ttl: "1 hour" })
  )
  if (wantedTarget("plain")) yield* plainTarget(tokens)
  if (wantedTarget("embedded")) yield* embeddedTarget(tokens)
  if (wantedTarget("distributed")) yield* distributedTarget(tokens)
  console.error(`idle: ${WARM + SOCKETS} sockets a path (${WARM} of them warm-up), ${round1((performance.now() - start) / 1000)} s in all`)
})
