/**
 * The hub-http suite: one `tools/call` round trip through `/hub` over Streamable HTTP (a POST
 * answered as JSON, on keep-alive connections) against the same round trip over the WebSocket
 * `/hub`, in the same all-in-one process, at 1×1 and 50×10. Targets: the 1×1 p50 within 1.5× the
 * WebSocket's, and the 50×10 throughput at least half of it. The same two clients against a plain
 * `ws` echo and a plain `node:http` echo measure the floor of those ratios in the same run: what
 * HTTP/1.1 costs against a WebSocket before Switchboard does anything (one request per connection
 * turn, one write per answer, where a socket batches ten in flight). `hub-floor` (servers.ts) is
 * the floor of the modern hub's own CPU target (issue 28): the same request parsed, one tab round
 * trip on a WebSocket, the JSON response, and nothing else.
 */
import * as Effect from "effect/Effect"
import * as Http from "node:http"
import * as Net from "node:net"
import { percentile, type Result, type Shape } from "./load.ts"
import { measure, measureWith, SECONDS, WARMUP } from "./measure.ts"
import { issueToken, Ready, startServer, startService, type Started, unlimited, wsUrl } from "./processes.ts"
import { benchTab, hubLoad, TOOL } from "./registry.ts"
import { print, report, round2, type ThroughputLine } from "./report.ts"


/** One POST on a kept-alive connection; the status and the body. */
const post = (agent: Http.Agent, url: URL, headers: Record<string, string>, body: string) =>
  new Promise<{ readonly status: number; readonly session: string | undefined; readonly body: string }>((resolve, reject) => {
    const req = Http.request(url, { method: "POST", agent, headers: { ...headers, "content-length": String(Buffer.byteLength(body)) } }, (res) => {
      const chunks: Array<Buffer> = []
      res.on("data", (c: Buffer) => chunks.push(c))
      res.on("end", () => {
        const session = res.headers["mcp-session-id"]
        resolve({ status: res.statusCode ?? 0, session: typeof session === "string" ? session : undefined, body: Buffer.concat(chunks).toString() })
      })
    })
    req.on("error", reject)
    req.end(body)
  })

/**
 * One kept-alive connection written and read by hand: Node's HTTP client costs more per request
 * than the edge's server does, and would measure itself. Answers are `content-length` JSON.
 */
const connection = (url: URL, sockets: Array<Net.Socket>) =>
  new Promise<(request: string) => Promise<string>>((resolve, reject) => {
    const socket = Net.connect(Number(url.port), url.hostname, () => resolve(send))
    sockets.push(socket)
    socket.setNoDelay(true)
    socket.once("error", reject)
    let buffered: Buffer = Buffer.alloc(0)
    let waiting: ((body: string) => void) | undefined
    socket.on("data", (chunk: Buffer) => {
      buffered = buffered.length === 0 ? chunk : Buffer.concat([buffered, chunk])
      const end = buffered.indexOf("\r\n\r\n")
      if (end < 0) return
      const head = buffered.subarray(0, end).toString("latin1")
      const length = Number(/content-length: *(\d+)/i.exec(head)?.[1] ?? 0)
      if (buffered.length < end + 4 + length) return
      const body = buffered.subarray(end + 4, end + 4 + length).toString()
      buffered = buffered.subarray(end + 4 + length)
      const w = waiting
      waiting = undefined
      w?.(head.slice(9, 12) === "200" ? body : `{"error":${JSON.stringify(head.slice(0, 12))}}`)
    })
    const send = (request: string) =>
      new Promise<string>((done) => {
        waiting = done
        socket.write(request)
      })
  })

/** What one client's POSTs carry: headers, and any params beside the tool's (MCP 2026-07-28's `_meta`, JSON text after a comma). */
interface Prepared {
  readonly headers: Record<string, string>
  readonly params?: string
}

/** Opens what one client's POSTs need (an MCP session, or nothing but headers). */
type Prepare = (agent: Http.Agent, url: URL) => Promise<Prepared>

/** An initialized MCP session of `token`'s user that lists the bench tab's tool. */
const mcpSession = (token: string): Prepare => async (agent, url) => {
  const base = { authorization: `Bearer ${token}`, accept: "application/json, text/event-stream", "content-type": "application/json" }
  const init = await post(agent, url, base, JSON.stringify({ jsonrpc: "2.0", id: "init", method: "initialize", params: { protocolVersion: "2025-06-18" } }))
  if (init.session === undefined) throw new Error(`initialize failed with ${init.status}: ${init.body}`)
  const headers = { ...base, "mcp-session-id": init.session, "mcp-protocol-version": "2025-06-18" }
  await post(agent, url, headers, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
  // Every session waits until the tab's tools are listed.
  await listed(agent, url, headers, `{"jsonrpc":"2.0","id":"list","method":"tools/list"}`)
  return { headers }
}

/** Every client waits until the tab's tool is listed. */
const listed = async (agent: Http.Agent, url: URL, headers: Record<string, string>, request: string) => {
  for (;;) {
    const answer = await post(agent, url, headers, request)
    if (answer.body.includes(TOOL)) return
    await new Promise((r) => setTimeout(r, 20))
  }
}

const MODERN_VERSION = "2026-07-28"
const modernBase = (token: string) =>
  ({ authorization: `Bearer ${token}`, accept: "application/json, text/event-stream", "content-type": "application/json", "mcp-protocol-version": MODERN_VERSION }) as const
const MODERN_META = `"_meta":{"io.modelcontextprotocol/protocolVersion":"${MODERN_VERSION}","io.modelcontextprotocol/clientInfo":{"name":"bench","version":"0"},"io.modelcontextprotocol/clientCapabilities":{}}`

/** What a modern tools/call carries: the same bytes to the hub and to its floor. */
const modernCall = (token: string): Prepared => ({ headers: { ...modernBase(token), "mcp-method": "tools/call", "mcp-name": TOOL }, params: `,${MODERN_META}` })

/** MCP 2026-07-28: no session, every request says its version and capabilities; only headers to prepare. */
const modern = (token: string): Prepare => async (agent, url) => {
  await listed(agent, url, { ...modernBase(token), "mcp-method": "tools/list" }, `{"jsonrpc":"2.0","id":"list","method":"tools/list","params":{${MODERN_META}}}`)
  return modernCall(token)
}

/** The plain echo needs nothing but the content type. */
const noSession: Prepare = () => Promise.resolve({ headers: { "content-type": "application/json" } })

/** A session per client, each with `inFlight` POSTs outstanding, closed loop. */
const runHttp = async (url: URL, prepare: Prepare, shape: Shape, onWindow: (edge: "open" | "close") => void, onError: () => void): Promise<Result> => {
  const agent = new Http.Agent({ keepAlive: true, maxSockets: Infinity })
  const sessions = await Promise.all(Array.from({ length: shape.clients }, () => prepare(agent, url)))
  const latencies: Array<number> = []
  let measuring = false
  let stopped = false
  let count = 0
  const sockets: Array<Net.Socket> = []
  const loops = sessions.flatMap(({ headers, params = "" }) =>
    Array.from({ length: shape.inFlight }, async (_, slot) => {
      const send = await connection(url, sockets)
      const head = `POST ${url.pathname} HTTP/1.1\r\nhost: ${url.host}\r\n${Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join("")}`
      let n = 0
      while (!stopped) {
        const body = `{"jsonrpc":"2.0","id":${slot * 1_000_000_000 + n++},"method":"tools/call","params":{"name":"${TOOL}","arguments":{}${params}}}`
        const t0 = performance.now()
        const answer = await send(`${head}content-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`)
        if (answer.includes(`"error"`)) onError()
        if (measuring) {
          latencies.push((performance.now() - t0) * 1000)
          count++
        }
      }
    })
  )
  await new Promise((r) => setTimeout(r, WARMUP * 1000))
  onWindow("open")
  measuring = true
  const start = performance.now()
  await new Promise((r) => setTimeout(r, SECONDS * 1000))
  measuring = false
  const elapsed = (performance.now() - start) / 1000
  onWindow("close")
  stopped = true
  await Promise.race([Promise.all(loops), new Promise((r) => setTimeout(r, 5000))])
  agent.destroy()
  for (const socket of sockets) socket.destroy()
  const sorted = Float64Array.from(latencies).sort()
  return { msgsPerSec: Math.round(count / elapsed), p50Us: Math.round(percentile(sorted, 50)), p99Us: Math.round(percentile(sorted, 99)), count }
}

const measureHttp = (name: string, server: Started, path: string, prepare: Prepare, onError: () => void) => {
  const url = new URL(`${wsUrl(server, path).replace(/^ws/, "http")}`)
  return measureWith("hub-http", name, [["server", [server]]], (shape, onWindow) => runHttp(url, prepare, shape, onWindow, onError))
}

export const hubHttpSuite = Effect.scoped(Effect.gen(function*() {
  const token = yield* issueToken({ sub: "bench-user", ttl: "1 hour" })
  const server = yield* startService("all-in-one", "services/all-in-one/src/main.ts", unlimited, [Ready.edge, Ready.registry])
  yield* Effect.acquireRelease(
    Effect.promise(() => benchTab(`${wsUrl(server, "/tabs")}?token=${token}`, 1, "calls.bench.example.com", "echo")),
    (ws) => Effect.sync(() => ws.terminate())
  )
  let errors = 0
  const onError = () => errors++
  const ws = yield* measure("hub-http", { name: "hub-websocket", server: [server], load: hubLoad(`${wsUrl(server, "/hub")}?token=${token}`, onError) })
  const http = yield* measureHttp("hub-streamable-http", server, "/hub", mcpSession(token), onError)
  const stateless = yield* measureHttp("hub-http-2026-07-28", server, "/hub", modern(token), onError)
  report([...ws, ...http, ...stateless], { ratio_to_ws: "hub-websocket" })
  const plainWsServer = yield* startServer("plain")
  const plainHttpServer = yield* startServer("plain-http")
  const plainWs = yield* measure("hub-http", { name: "plain-ws-echo", server: [plainWsServer], load: { url: wsUrl(plainWsServer, "/") } })
  const plainHttp = yield* measureHttp("plain-http-echo", plainHttpServer, "/", noSession, onError)
  // The hub call's own floor (servers.ts hub-floor): the modern request's bytes, a tab round trip.
  const floorServer = yield* startServer("hub-floor")
  yield* Effect.acquireRelease(
    Effect.promise(() => benchTab(wsUrl(floorServer, "/tabs"), 1, "calls.bench.example.com", "echo")),
    (ws) => Effect.sync(() => ws.terminate())
  )
  const floor = yield* measureHttp("hub-floor", floorServer, "/hub", () => Promise.resolve(modernCall(token)), onError)
  report([...plainWs, ...plainHttp, ...floor], { ratio_to_ws: "plain-ws-echo", ratio_to_plain_http: "plain-http-echo" })
  const p50 = (lines: ReadonlyArray<ThroughputLine>) => Number(lines.find((l) => l.shape === "1x1")?.["p50_us"] ?? 0)
  const rate = (lines: ReadonlyArray<ThroughputLine>) => Number(lines.find((l) => l.shape === "50x10")?.["msgs_per_s"] ?? 0)
  const cpu = (lines: ReadonlyArray<ThroughputLine>) => Number(lines.find((l) => l.shape === "50x10")?.["server_cpu_us_per_msg"] ?? 0)
  const ratios = (target: string, httpLines: ReadonlyArray<ThroughputLine>, wsLines: ReadonlyArray<ThroughputLine>) => {
    print({ suite: "hub-http", target, measure: "p50_over_ws_p50_1x1", ratio: round2(p50(httpLines) / Math.max(1, p50(wsLines))), target_at_most: 1.5 })
    print({ suite: "hub-http", target, measure: "throughput_over_ws_50x10", ratio: round2(rate(httpLines) / Math.max(1, rate(wsLines))), target_at_least: 0.5 })
  }
  ratios("hub-streamable-http", http, ws)
  ratios("hub-http-2026-07-28", stateless, ws)
  // The modern era's own targets, against the legacy era and the plain HTTP echo of this run.
  print({ suite: "hub-http", target: "hub-http-2026-07-28", measure: "p50_over_legacy_p50_1x1", ratio: round2(p50(stateless) / Math.max(1, p50(http))), target_at_most: 1 })
  print({ suite: "hub-http", target: "hub-http-2026-07-28", measure: "throughput_over_plain_http_50x10", ratio: round2(rate(stateless) / Math.max(1, rate(plainHttp))), target_at_least: 0.5 })
  print({ suite: "hub-http", target: "hub-http-2026-07-28", measure: "cpu_over_plain_http_50x10", ratio: round2(cpu(stateless) / Math.max(1, cpu(plainHttp))), target_at_most: 2 })
  // How close to the CPU target a hub call can come at all: its floor against the echo, and the hub against its floor.
  print({ suite: "hub-http", target: "hub-floor", measure: "cpu_over_plain_http_50x10", ratio: round2(cpu(floor) / Math.max(1, cpu(plainHttp))) })
  print({ suite: "hub-http", target: "hub-floor", measure: "throughput_over_plain_http_50x10", ratio: round2(rate(floor) / Math.max(1, rate(plainHttp))) })
  print({ suite: "hub-http", target: "hub-http-2026-07-28", measure: "cpu_over_hub_floor_50x10", ratio: round2(cpu(stateless) / Math.max(1, cpu(floor))) })
  // The same ratios between plain echoes: how close to the targets HTTP/1.1 itself can come here.
  ratios("plain-http-echo (floor)", plainHttp, plainWs)
  if (errors > 0) console.error(`warning: ${errors} calls were answered with an error; the figures are not comparable`)
}))
