/**
 * The hub-http suite: one `tools/call` round trip through `/hub` over Streamable HTTP (a POST
 * answered as JSON, on keep-alive connections), legacy (2025-06-18 session) and modern
 * (2026-07-28, stateless), against the same round trip over the WebSocket `/hub`, at 1×1 and
 * 50×10, in two deployments: the all-in-one process (embedded), and edges, auth and registry as
 * processes of their own on NATS (distributed: the tab on edge A, the clients on edge B, so every
 * call crosses edges). The same two clients against a plain `ws` echo and a plain `node:http` echo
 * measure the floor of those ratios in the same run: what HTTP/1.1 costs against a WebSocket
 * before Switchboard does anything (one request per connection turn, one write per answer, where
 * a socket batches ten in flight). `hub-floor` (servers.ts) is the floor of the modern hub's own
 * CPU target (issue 28): the same request parsed, one tab round trip on a WebSocket, the JSON
 * response, and nothing else.
 */
import * as Effect from "effect/Effect"
import * as Http from "node:http"
import * as Net from "node:net"
import { type LoadOptions, percentile, type Result, run, type Shape } from "./load.ts"
import { measureWith, paired, SECONDS, WARMUP } from "./measure.ts"
import {
  benchProcess,
  type Groups,
  issueToken,
  natsProcess,
  Ready,
  startServer,
  startService,
  type Started,
  unlimited,
  withNats,
  wsUrl
} from "./processes.ts"
import { benchTab, hubLoad, TOOL } from "./registry.ts"
import { print, round2, type ThroughputLine } from "./report.ts"


/** One request (a POST unless told) on a kept-alive connection; the status and the body. */
const post = (agent: Http.Agent, url: URL, headers: Record<string, string>, body: string, method = "POST") =>
  new Promise<{ readonly status: number; readonly session: string | undefined; readonly body: string }>((resolve, reject) => {
    const req = Http.request(url, { method, agent, headers: { ...headers, "content-length": String(Buffer.byteLength(body)) } }, (res) => {
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
  /** Ends what `Prepare` opened, once the run is over. */
  readonly release?: () => Promise<void>
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
  // Deleted after the run, as a client does when it is done: a user may hold only so many sessions
  // (REGISTRY_MAX_HTTP_SESSIONS_PER_USER, 100), and the warm-up and the shapes open 101.
  const release = async () => {
    const deleted = await post(agent, url, headers, "", "DELETE")
    if (deleted.status >= 300) throw new Error(`DELETE of session ${init.session} failed with ${deleted.status}: ${deleted.body}`)
  }
  return { headers, release }
}

/**
 * Every client waits until the tab's tool is listed. Bounded, so that a deployment that never
 * lists it (a service that did not start serving) ends the run with the last answer, not a hang.
 */
const LISTED_WITHIN_MS = 30_000
const listed = async (agent: Http.Agent, url: URL, headers: Record<string, string>, request: string) => {
  const deadline = performance.now() + LISTED_WITHIN_MS
  for (;;) {
    const answer = await post(agent, url, headers, request)
    if (answer.body.includes(TOOL)) return
    if (performance.now() > deadline) throw new Error(`${url.host}: ${TOOL} not listed within ${LISTED_WITHIN_MS / 1000} s; last answer ${answer.status}: ${answer.body.slice(0, 300)}`)
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

/** A session per client, each with `inFlight` POSTs outstanding, closed loop, for `seconds` after WARMUP. */
const runHttp = async (
  url: URL,
  prepare: Prepare,
  shape: Shape,
  seconds: number,
  onWindow: (edge: "open" | "close") => void,
  onError: () => void
): Promise<Result> => {
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
  await new Promise((r) => setTimeout(r, seconds * 1000))
  measuring = false
  const elapsed = (performance.now() - start) / 1000
  onWindow("close")
  stopped = true
  await Promise.race([Promise.all(loops), new Promise((r) => setTimeout(r, 5000))])
  for (const socket of sockets) socket.destroy()
  await Promise.all(sessions.map((s) => s.release?.()))
  agent.destroy()
  const sorted = Float64Array.from(latencies).sort()
  return { msgsPerSec: Math.round(count / elapsed), p50Us: Math.round(percentile(sorted, 50)), p99Us: Math.round(percentile(sorted, 99)), count }
}


// --- targets ---------------------------------------------------------------------------------

/**
 * Which targets to measure (BENCH_HUB_HTTP_TARGETS=embedded,baselines,distributed; all by
 * default): a change to one deployment is iterated on against it alone. `baselines` are the plain
 * echoes and hub-floor, whose ratios every hub line reports; without them those ratios are null.
 */
const TARGET_NAMES = ["embedded", "baselines", "distributed"] as const
type TargetName = typeof TARGET_NAMES[number]
const targetsSetting = (raw: string | undefined): Effect.Effect<ReadonlySet<TargetName>, Error> => {
  if (raw === undefined) return Effect.succeed(new Set(TARGET_NAMES))
  const names = raw.split(",").map((s) => s.trim()).filter((s) => s !== "")
  const known = names.filter((n): n is TargetName => (TARGET_NAMES as ReadonlyArray<string>).includes(n))
  const unknown = names.filter((n) => !(TARGET_NAMES as ReadonlyArray<string>).includes(n))
  if (unknown.length > 0 || known.length === 0) {
    return Effect.fail(new Error(`BENCH_HUB_HTTP_TARGETS=${JSON.stringify(raw)}: ${unknown.length > 0 ? `unknown ${unknown.join(", ")}` : "names no target"}; expected a comma-separated list of ${TARGET_NAMES.join(", ")}`))
  }
  return Effect.succeed(new Set(known))
}

/** Calls answered with an error, by target: a fast error would otherwise pass for throughput. */
const errors = new Map<string, number>()
const countError = (target: string) => () => errors.set(target, (errors.get(target) ?? 0) + 1)

/**
 * Seconds of unmeasured 50×10 load before a target's first shape. The 0.5 s warm-up of each shape
 * is a few hundred calls at 1×1, too few for V8 to optimise a path that spans four fresh processes:
 * the distributed WebSocket /hub, measured first, did 3,172 calls/s at 50×10 (p50 3,989 µs at
 * 1×1), and 12,119 (1,137 µs) when measured again after the HTTP targets, in one run.
 */
const WARM_SECONDS = 2

/** `runShape` unmeasured at 50×10 for WARM_SECONDS, then measured at every shape. */
const warmedThenMeasured = (name: string, groups: Groups, runShape: (shape: Shape, seconds: number, onWindow: (edge: "open" | "close") => void) => Promise<Result>) =>
  Effect.zipRight(
    Effect.tryPromise(() => runShape({ clients: 50, inFlight: 10 }, WARM_SECONDS, () => {})),
    measureWith("hub-http", name, groups, (shape, onWindow) => runShape(shape, SECONDS, onWindow))
  )

/** A target's closed loop of POSTs to `path` on `clients`, its errors counted under `name`. */
const httpRunner = (name: string, clients: Started, path: string, prepare: Prepare) => {
  const url = new URL(`${wsUrl(clients, path).replace(/^ws/, "http")}`)
  return (shape: Shape, seconds: number, onWindow: (edge: "open" | "close") => void = () => {}) =>
    runHttp(url, prepare, shape, seconds, onWindow, countError(name))
}

const measureHttp = (name: string, clients: Started, path: string, groups: Groups, prepare: Prepare) =>
  warmedThenMeasured(name, groups, httpRunner(name, clients, path, prepare))

const measureWs = (name: string, groups: Groups, load: Pick<LoadOptions, "url" | "frame" | "setup" | "isReply">) =>
  warmedThenMeasured(name, groups, (shape, seconds, onWindow) => run({ ...load, shape, seconds, warmupSeconds: WARMUP, onWindow }))

/** One deployment of the hub: where the bench's tab connects, where the clients do, what is measured. */
interface Deployment {
  /** Appended to every target's name: "" embedded, "-distributed". */
  readonly suffix: string
  readonly tabs: Started
  readonly clients: Started
  /** `server` (every process of the deployment, NATS included where visible) first, then any apart. */
  readonly groups: Groups
}

/** The lines of one deployment, by role. */
interface HubLines {
  readonly suffix: string
  readonly ws: ReadonlyArray<ThroughputLine>
  readonly legacy: ReadonlyArray<ThroughputLine>
  readonly modern: ReadonlyArray<ThroughputLine>
}

/** The WebSocket, legacy and modern `/hub` calls of one deployment, to the bench's tab. */
const hubTargets = (deployment: Deployment, token: string) =>
  Effect.gen(function*() {
    const { clients, groups, suffix } = deployment
    yield* Effect.acquireRelease(
      Effect.promise(() => benchTab(`${wsUrl(deployment.tabs, "/tabs")}?token=${token}`, 1, "calls.bench.example.com", "echo")),
      (ws) => Effect.sync(() => ws.terminate())
    )
    // The tool listed on the clients' side first, within a bound: the WebSocket load's setup would wait forever.
    const httpUrl = new URL(`${wsUrl(clients, "/hub").replace(/^ws/, "http")}`)
    yield* Effect.tryPromise(() => {
      const agent = new Http.Agent({ keepAlive: false })
      return modern(token)(agent, httpUrl).finally(() => agent.destroy())
    })
    const wsName = `hub-websocket${suffix}`
    const ws = yield* measureWs(wsName, groups, hubLoad(`${wsUrl(clients, "/hub")}?token=${token}`, countError(wsName)))
    const legacyName = `hub-streamable-http${suffix}`
    const modernName = `hub-http-2026-07-28${suffix}`
    const legacy = yield* measureHttp(legacyName, clients, "/hub", groups, mcpSession(token))
    const modernLines = yield* measureHttp(modernName, clients, "/hub", groups, modern(token))
    // Issue 28's latency target, the modern era's 1×1 p50 within the legacy era's: in pairs on the
    // same deployment, since the two lines are measured a minute apart on a machine whose speed
    // drifts by more than the difference looked for.
    yield* paired({
      suite: "hub-http",
      target: modernName,
      measure: "p50_over_legacy_p50_1x1_paired",
      baseline: httpRunner(legacyName, clients, "/hub", mcpSession(token)),
      load: httpRunner(modernName, clients, "/hub", modern(token)),
      shape: { clients: 1, inFlight: 1 },
      ratio: (target, legacy) => target.p50Us / legacy.p50Us
    })
    return { suffix, ws, legacy, modern: modernLines } satisfies HubLines
  })

/** The all-in-one process: edge, registry and auth on the embedded bus. */
const embeddedHub = (token: string) =>
  Effect.scoped(Effect.gen(function*() {
    const server = yield* startService("all-in-one", "services/all-in-one/src/main.ts", unlimited, [Ready.edge, Ready.registry])
    return yield* hubTargets({ suffix: "", tabs: server, clients: server, groups: [["server", [server]]] }, token)
  }))

/**
 * What a user deploys for the hub on NATS: two edges, auth and a registry, each its own process.
 * The tab on edge A and the clients on edge B, so that every call goes edge B → registry → edge A
 * → tab and back over NATS. `server_*` sums every process, nats-server included where this machine
 * can see it, as the all-in-one's one process carries the same work; each is also reported apart.
 */
const distributedHub = (token: string) =>
  withNats((natsUrl) =>
    Effect.scoped(Effect.gen(function*() {
      // Its own namespace, so that no KV record of another run or suite on this NATS is seen.
      const env = { ...unlimited, NATS_URL: natsUrl, SWITCHBOARD_NAMESPACE: `bench${process.pid}h` }
      // Edge A first: the edges and the registry's actor host open the `edges` bucket with different
      // options (TTL or none), and two first-time creators racing make one of them fail to start.
      const edgeA = yield* startService("edge A", "services/edge/src/main.ts", env, [Ready.edge])
      const [auth, registry, edgeB] = yield* Effect.all(
        [
          startService("auth", "services/auth/src/main.ts", env, [Ready.auth]),
          startService("registry", "services/registry/src/main.ts", env, [Ready.registry]),
          startService("edge B", "services/edge/src/main.ts", env, [Ready.edge])
        ],
        { concurrency: "unbounded" }
      )
      const nats = natsProcess(natsUrl)
      const services = [edgeA, edgeB, auth, registry]
      const groups: Groups = [
        ["server", nats === undefined ? services : [...services, nats]],
        ["edges", [edgeA, edgeB]],
        ["registry", [registry]],
        ["auth", [auth]],
        ...(nats === undefined ? [] : [["nats", [nats]] as const]),
        ["bench", [benchProcess]]
      ]
      return yield* hubTargets({ suffix: "-distributed", tabs: edgeA, clients: edgeB, groups }, token)
    }))
  )

/** The plain echoes and the hub call's floor, each a process of its own, up together. */
const baselineTargets = (token: string) =>
  Effect.scoped(Effect.gen(function*() {
    const plainWsServer = yield* startServer("plain")
    const plainHttpServer = yield* startServer("plain-http")
    const plainWs = yield* measureWs("plain-ws-echo", [["server", [plainWsServer]]], { url: wsUrl(plainWsServer, "/") })
    const plainHttp = yield* measureHttp("plain-http-echo", plainHttpServer, "/", [["server", [plainHttpServer]]], noSession)
    // The hub call's own floor (servers.ts hub-floor): the modern request's bytes, a tab round trip.
    const floorServer = yield* startServer("hub-floor")
    yield* Effect.acquireRelease(
      Effect.promise(() => benchTab(wsUrl(floorServer, "/tabs"), 1, "calls.bench.example.com", "echo")),
      (ws) => Effect.sync(() => ws.terminate())
    )
    const floor = yield* measureHttp("hub-floor", floorServer, "/hub", [["server", [floorServer]]], () => Promise.resolve(modernCall(token)))
    return { plainWs, plainHttp, floor }
  }))

// --- report ----------------------------------------------------------------------------------

const at = (lines: ReadonlyArray<ThroughputLine>, shape: string) => lines.find((l) => l.shape === shape)
const field = (line: ThroughputLine | undefined, name: string) => {
  const value = line?.[name]
  return typeof value === "number" ? value : undefined
}
/** own / base, or null when either is missing (a target not run) or the base is 0. */
const ratioOf = (own: number | undefined, base: number | undefined) =>
  own === undefined || base === undefined || base === 0 ? null : round2(own / base)

/**
 * Each line with its throughput over the WebSocket `/hub` of its deployment (the plain `ws` echo
 * for the plain echoes), over the plain HTTP echo's and over hub-floor's, and its server CPU per
 * message over theirs, at the same shape; a distributed line also over its embedded counterpart's.
 */
const reportLines = (
  lines: ReadonlyArray<ThroughputLine>,
  wsOf: ReadonlyArray<ThroughputLine>,
  plainHttp: ReadonlyArray<ThroughputLine>,
  floor: ReadonlyArray<ThroughputLine>,
  embedded?: (line: ThroughputLine) => ThroughputLine | undefined
) => {
  for (const line of lines) {
    const own = embedded?.(line)
    const ws = at(wsOf, line.shape)
    const echo = at(plainHttp, line.shape)
    const hubFloor = at(floor, line.shape)
    print({
      ...line,
      ratio_to_ws: ratioOf(line.msgs_per_s, field(ws, "msgs_per_s")),
      ratio_to_plain_http: ratioOf(line.msgs_per_s, field(echo, "msgs_per_s")),
      ratio_to_hub_floor: ratioOf(line.msgs_per_s, field(hubFloor, "msgs_per_s")),
      cpu_ratio_to_plain_http: ratioOf(field(line, "server_cpu_us_per_msg"), field(echo, "server_cpu_us_per_msg")),
      cpu_ratio_to_hub_floor: ratioOf(field(line, "server_cpu_us_per_msg"), field(hubFloor, "server_cpu_us_per_msg")),
      ...(embedded === undefined ? {} : {
        ratio_to_embedded: ratioOf(line.msgs_per_s, field(own, "msgs_per_s")),
        p50_ratio_to_embedded: ratioOf(field(line, "p50_us"), field(own, "p50_us")),
        cpu_ratio_to_embedded: ratioOf(field(line, "server_cpu_us_per_msg"), field(own, "server_cpu_us_per_msg"))
      })
    })
  }
}

export const hubHttpSuite = Effect.scoped(Effect.gen(function*() {
  const targets = yield* targetsSetting(process.env["BENCH_HUB_HTTP_TARGETS"])
  const token = yield* issueToken({ sub: "bench-user", ttl: "1 hour" })
  const embedded = targets.has("embedded") ? [yield* embeddedHub(token)] : []
  const baselines = targets.has("baselines") ? yield* baselineTargets(token) : { plainWs: [], plainHttp: [], floor: [] }
  const distributed = targets.has("distributed") ? [yield* distributedHub(token)] : []
  const { floor, plainHttp, plainWs } = baselines
  const embeddedLines = embedded.flatMap((hub) => [...hub.ws, ...hub.legacy, ...hub.modern])
  const embeddedOf = (line: ThroughputLine) => embeddedLines.find((l) => l.shape === line.shape && `${l.target}-distributed` === line.target)
  for (const hub of embedded) reportLines([...hub.ws, ...hub.legacy, ...hub.modern], hub.ws, plainHttp, floor)
  for (const hub of distributed) reportLines([...hub.ws, ...hub.legacy, ...hub.modern], hub.ws, plainHttp, floor, embeddedOf)
  reportLines([...plainWs, ...plainHttp, ...floor], plainWs, plainHttp, floor)

  /** A summary line, only when both sides were measured. */
  const summary = (target: string, measure: string, ratio: number | null, bound: Record<string, number> = {}) => {
    if (ratio !== null) print({ suite: "hub-http", target, measure, ratio, ...bound })
  }
  const p50 = (lines: ReadonlyArray<ThroughputLine>) => field(at(lines, "1x1"), "p50_us")
  const rate = (lines: ReadonlyArray<ThroughputLine>) => field(at(lines, "50x10"), "msgs_per_s")
  const cpu = (lines: ReadonlyArray<ThroughputLine>) => field(at(lines, "50x10"), "server_cpu_us_per_msg")
  const overWs = (target: string, httpLines: ReadonlyArray<ThroughputLine>, wsLines: ReadonlyArray<ThroughputLine>) => {
    summary(target, "p50_over_ws_p50_1x1", ratioOf(p50(httpLines), p50(wsLines)), { target_at_most: 1.5 })
    summary(target, "throughput_over_ws_50x10", ratioOf(rate(httpLines), rate(wsLines)), { target_at_least: 0.5 })
  }
  for (const hub of [...embedded, ...distributed]) {
    const modernName = `hub-http-2026-07-28${hub.suffix}`
    overWs(`hub-streamable-http${hub.suffix}`, hub.legacy, hub.ws)
    overWs(modernName, hub.modern, hub.ws)
    // The modern era's own targets, against the legacy era of its deployment and the plain HTTP echo of this run.
    summary(modernName, "p50_over_legacy_p50_1x1", ratioOf(p50(hub.modern), p50(hub.legacy)), { target_at_most: 1 })
    summary(modernName, "throughput_over_plain_http_50x10", ratioOf(rate(hub.modern), rate(plainHttp)), { target_at_least: 0.5 })
    summary(modernName, "cpu_over_plain_http_50x10", ratioOf(cpu(hub.modern), cpu(plainHttp)), { target_at_most: 2 })
    summary(modernName, "cpu_over_hub_floor_50x10", ratioOf(cpu(hub.modern), cpu(floor)))
    summary(`hub-streamable-http${hub.suffix}`, "cpu_over_plain_http_50x10", ratioOf(cpu(hub.legacy), cpu(plainHttp)))
  }
  // How close to the CPU target a hub call can come at all: its floor against the echo.
  summary("hub-floor", "cpu_over_plain_http_50x10", ratioOf(cpu(floor), cpu(plainHttp)))
  summary("hub-floor", "throughput_over_plain_http_50x10", ratioOf(rate(floor), rate(plainHttp)))
  // The same ratios between plain echoes: how close to the targets HTTP/1.1 itself can come here.
  overWs("plain-http-echo (floor)", plainHttp, plainWs)
  for (const [target, n] of errors) console.error(`warning: ${target}: ${n} calls were answered with an error; its figures are not comparable`)
}))
