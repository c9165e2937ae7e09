/**
 * `npm run bench [-- suite ...]`: prints one JSON line per measurement (msgs/s, p50/p99 µs, server
 * RSS and CPU per message), each suite measured against its baselines in the same run.
 * Suites: edge (the edge and bus alone), proxy (a full MCP proxy round trip through an extension),
 * mcpx (fan-out of chat in one 100-member MCPx topic, open loop; its lines are per offered rate,
 * doubling until p99 passes 50 ms, then the knee), mcpx-crowd (the same in one 1,000-member topic),
 * registry (MCP-B: tool registration latency, and tools/call round trips through /hub to a tab),
 * hub-http (the same tools/call round trip over Streamable HTTP, legacy and 2026-07-28, against the
 * WebSocket /hub, all-in-one and distributed),
 * cdp (Runtime.evaluate in a page of the user's browser through /cdp/{extension_id}, against direct CDP),
 * idle (RSS per idle authenticated socket on every WebSocket path; not run by default, it takes minutes),
 * mcpx-topics (5,000 topics of 5: time to join, RSS per topic, then chat over all; not run by default).
 * NATS comes from the same testcontainer the tests use.
 */
import { cdpSuite } from "./cdp.ts"
import * as Effect from "effect/Effect"
import type { WebSocket } from "ws"
import { measure, paired, type Target } from "./measure.ts"
import { mcpxCrowdSuite, mcpxSuite } from "./mcpx.ts"
import { mcpxTopicsSuite } from "./topics.ts"
import { hubHttpSuite } from "./hubHttp.ts"
import { idleSuite } from "./idle.ts"
import { registrySuite } from "./registry.ts"
import { benchProcess, issueToken, natsProcess, Ready, startServer, startService, unlimited, withNats, wsUrl } from "./processes.ts"
import { report } from "./report.ts"
import { benchExtension, isRecord, parseRecord } from "./frames.ts"

// --- edge suite ----------------------------------------------------------------------------

const edgeSuite = Effect.gen(function*() {
  const target = (name: string, kind: string, env: Readonly<Record<string, string>>, path: string) =>
    Effect.scoped(Effect.flatMap(startServer(kind, env), (s) => measure("edge", { name, server: [s], load: { url: wsUrl(s, path) } })))
  /**
   * The embedded edge against the plain echo in pairs of windows, both up at once: the lines above
   * measure each a minute apart, and at 1×1 one run's ratio moved by ±10 % between runs of the
   * same code (issue 16's paired regression check needs it within 5 %).
   */
  const embeddedPaired = Effect.scoped(Effect.gen(function*() {
    const plain = yield* startServer("plain", {})
    const edge = yield* startServer("edge", {})
    for (const [shape, label] of [[{ clients: 1, inFlight: 1 }, "1x1"], [{ clients: 50, inFlight: 10 }, "50x10"]] as const) {
      yield* paired({
        suite: "edge",
        target: "switchboard-embedded",
        measure: `msgs_per_s_over_plain_${label}_paired`,
        baseline: { url: wsUrl(plain, "/") },
        load: { url: wsUrl(edge, "/echo") },
        shape,
        ratio: (t, b) => t.msgsPerSec / b.msgsPerSec
      })
    }
  }))
  const lines = [
    ...(yield* target("plain-ws-echo", "plain", {}, "/")),
    ...(yield* target("switchboard-embedded", "edge", {}, "/echo")),
    ...(yield* withNats((url) =>
      Effect.map(
        Effect.all([target("hand-written-nats-relay", "relay", { NATS_URL: url }, "/"), target("switchboard-nats", "edge", { NATS_URL: url }, "/echo")]),
        (results) => results.flat()
      )
    ))
  ]
  report(lines, { ratio_to_plain: "plain-ws-echo" })
  yield* embeddedPaired
})

// --- proxy suite ---------------------------------------------------------------------------

/** One control request of an MCP client, answered directly by the proxy. */
const call = (ws: WebSocket, id: string, method: string, params: Record<string, unknown>) =>
  new Promise<Record<string, unknown>>((resolve, reject) => {
    const onMessage = (data: Buffer) => {
      const message = parseRecord(data)
      if (message?.["id"] !== id) return
      clearTimeout(timer)
      ws.off("message", onMessage)
      const result = message["result"]
      if (isRecord(result)) resolve(result)
      else reject(new Error(`${method} failed: ${data.toString()}`))
    }
    const timer = setTimeout(() => {
      ws.off("message", onMessage)
      reject(new Error(`${method}: no answer within 15 s`))
    }, 15_000)
    ws.on("message", onMessage)
    ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }))
  })

/** Handshake and connect; every frame after that is forwarded to the extension. */
const mcpSession = (token: string, extensionId: string) => async (ws: WebSocket) => {
  await call(ws, "bench-handshake", "mcp_handshake", { accessToken: token })
  await call(ws, "bench-connect", "connect", { extension_id: extensionId })
}

const METHOD = Buffer.from(`"method"`)
const ERROR = Buffer.from(`"error"`)

/**
 * Replies are told from the proxy's notifications without parsing: a JSON-RPC response never has
 * a `method` member, and the extension's results are empty. Error replies are counted, since a
 * fast error (a limit, a lost session) would otherwise pass for throughput.
 */
const replyCounter = () => {
  let errors = 0
  return {
    isReply: (data: Buffer) => {
      if (data.includes(METHOD)) return false
      if (data.includes(ERROR)) errors++
      return true
    },
    errors: () => errors
  }
}

/**
 * A full proxied round trip: the extension on `extensionUrl`, the MCP clients on `mcpUrl`. Returns
 * the lines and the load, for pairs against another target.
 */
const proxyTarget = (
  name: string,
  processes: Pick<Target, "server" | "apart">,
  extensionUrl: string,
  mcpUrl: string,
  token: string
) =>
  Effect.gen(function*() {
    const { extensionId } = yield* benchExtension(extensionUrl, token)
    const replies = replyCounter()
    const load = { url: mcpUrl, setup: mcpSession(token, extensionId), isReply: replies.isReply }
    const lines = yield* measure("proxy", { name, ...processes, load })
    const warnErrors = () => {
      if (replies.errors() > 0) console.error(`warning: ${name} answered ${replies.errors()} requests with an error; its throughput is not comparable`)
    }
    return { lines, load, warnErrors }
  })

const proxySuite = Effect.scoped(Effect.gen(function*() {
  const token = yield* issueToken({ sub: "bench-user", ttl: "1 hour" })

  // Up for the whole suite, idle while the other targets run, for the distributed target's pairs.
  const plainServer = yield* startServer("plain")
  const plainUrl = wsUrl(plainServer, "/")
  const plain = measure("proxy", { name: "plain-ws-echo", server: [plainServer], load: { url: plainUrl } })
  const naive = Effect.scoped(
    Effect.flatMap(startServer("naive-relay"), (s) =>
      Effect.map(proxyTarget("naive-relay", { server: [s] }, wsUrl(s, "/extension"), wsUrl(s, "/mcp"), token), (t) => {
        t.warnErrors()
        return t.lines
      }))
  )
  const embedded = Effect.scoped(
    Effect.flatMap(
      startService("all-in-one", "services/all-in-one/src/main.ts", unlimited, [Ready.edge, Ready.router]),
      (s) =>
        Effect.map(proxyTarget("switchboard-embedded", { server: [s] }, wsUrl(s, "/extension"), wsUrl(s, "/mcp"), token), (t) => {
          t.warnErrors()
          return t.lines
        })
    )
  )
  const distributed = withNats((natsUrl) =>
    Effect.scoped(Effect.gen(function*() {
      const nats = natsProcess(natsUrl)
      // The hand-written floor first, on the same NATS, and kept up (idle) for the pairs below.
      const relayRouter = yield* startServer("nats-relay-router", { NATS_URL: natsUrl })
      const [relayA, relayB] = yield* Effect.all(
        [startServer("nats-relay-edge", { NATS_URL: natsUrl }), startServer("nats-relay-edge", { NATS_URL: natsUrl })],
        { concurrency: "unbounded" }
      )
      // As the distributed target below: the extension on edge A, the clients on edge B.
      const relay = yield* proxyTarget(
        "nats-relay",
        { server: [relayA, relayB], apart: { router: relayRouter, nats, bench: benchProcess } },
        wsUrl(relayA, "/extension"),
        wsUrl(relayB, "/mcp"),
        token
      )

      // Its own namespace, so that no KV record of another run or suite on this NATS is seen.
      const env = { ...unlimited, NATS_URL: natsUrl, SWITCHBOARD_NAMESPACE: `bench${process.pid}` }
      // Edge A first: the edges and the router's actor host open the `edges` bucket with different
      // options (TTL or none), and two first-time creators racing make one of them fail to start.
      const edgeA = yield* startService("edge A", "services/edge/src/main.ts", env, [Ready.edge])
      const [, router, edgeB] = yield* Effect.all(
        [
          startService("auth", "services/auth/src/main.ts", env, [Ready.auth]),
          startService("router", "services/router/src/main.ts", env, [Ready.router]),
          startService("edge B", "services/edge/src/main.ts", env, [Ready.edge])
        ],
        { concurrency: "unbounded" }
      )
      // The extension on edge A and the clients on edge B: every request crosses edges over NATS.
      const switchboard = yield* proxyTarget(
        "switchboard-distributed",
        { server: [edgeA, edgeB], apart: { router, nats, bench: benchProcess } },
        wsUrl(edgeA, "/extension"),
        wsUrl(edgeB, "/mcp"),
        token
      )
      const name = "switchboard-distributed"
      yield* paired({
        suite: "proxy",
        target: name,
        measure: "msgs_per_s_over_plain_50x10_paired",
        baseline: { url: plainUrl },
        load: switchboard.load,
        shape: { clients: 50, inFlight: 10 },
        ratio: (target, plain) => target.msgsPerSec / plain.msgsPerSec
      })
      // Issue 16's latency target, distributed p50 within 1.25× of the relay's: in pairs, since the
      // lines above measured the two a minute apart on a machine whose speed drifts.
      yield* paired({
        suite: "proxy",
        target: name,
        measure: "p50_over_nats_relay_p50_1x1_paired",
        baseline: relay.load,
        load: switchboard.load,
        shape: { clients: 1, inFlight: 1 },
        ratio: (target, floor) => target.p50Us / floor.p50Us
      })
      yield* paired({
        suite: "proxy",
        target: name,
        measure: "msgs_per_s_over_nats_relay_50x10_paired",
        baseline: relay.load,
        load: switchboard.load,
        shape: { clients: 50, inFlight: 10 },
        ratio: (target, floor) => target.msgsPerSec / floor.msgsPerSec
      })
      relay.warnErrors()
      switchboard.warnErrors()
      return [...relay.lines, ...switchboard.lines]
    }))
  )

  const lines = [...(yield* plain), ...(yield* naive), ...(yield* embedded), ...(yield* distributed)]
  report(
    lines,
    { ratio_to_plain: "plain-ws-echo", ratio_to_naive_relay: "naive-relay", ratio_to_nats_relay: "nats-relay" },
    { p50_ratio_to_nats_relay: "nats-relay" }
  )
}))

// --- entry ---------------------------------------------------------------------------------

const suites: Record<string, Effect.Effect<void, unknown>> = {
  edge: edgeSuite,
  proxy: proxySuite,
  mcpx: mcpxSuite,
  "mcpx-crowd": mcpxCrowdSuite,
  registry: registrySuite,
  "hub-http": hubHttpSuite,
  cdp: cdpSuite
}
/** Run only when named: they open 10,000 sockets on each of five paths per target, or 25,000 at once, for minutes. */
const onDemand: Record<string, Effect.Effect<void, unknown>> = { idle: idleSuite, "mcpx-topics": mcpxTopicsSuite }

const wanted = process.argv.slice(2).filter((a) => a !== "--")
const unknown = wanted.filter((s) => !(s in suites) && !(s in onDemand))
if (wanted.includes("--help") || wanted.includes("-h") || unknown.length > 0) {
  console.log(
    [
      `Usage: npm run bench [-- ${[...Object.keys(suites), ...Object.keys(onDemand)].join(" | ")} ...]`,
      "",
      "Prints JSON lines: msgs/s, p50/p99 µs, server RSS and CPU per message.",
      "BENCH_SECONDS sets the measured seconds per shape or rate step (default 3).",
      "BENCH_MCPX_RATES sets the mcpx suite's first offered chats/s, one step each (default 100,250,500,1000); the rate then doubles",
      "  until a step fails (p99 >= 50 ms, or deliveries behind the offered rate) or would pass BENCH_MCPX_MAX_RATE (default 64000).",
      "BENCH_CROWD_SIZE sets the mcpx-crowd topic's participants (default 1000); BENCH_CROWD_RATES its first steps (default 2),",
      "  doubling up to BENCH_CROWD_MAX_RATE (default 1000).",
      "BENCH_TOPICS and BENCH_TOPIC_SIZE set the mcpx-topics suite's topics and participants per topic (default 5000 and 5),",
      "  BENCH_TOPICS_RATE the chats/s offered over all of them (default 1000), BENCH_TOPICS_IN_FLIGHT the joins at once (default 32).",
      "  Its sockets are spread over load processes of at most 10,000 each (the descriptor limit here is 20,000).",
      "BENCH_HUB_HTTP_TARGETS sets which hub-http targets run: embedded, baselines (the plain echoes and hub-floor), distributed",
      "  (edges, auth and registry on NATS), comma-separated; all by default. Ratios to a target not run are null.",
      "The cdp suite launches Debian's chromium with the extension: Runtime.evaluate through /cdp/{extension_id} against direct CDP.",
      "BENCH_REGISTRY_ROUNDS sets how many tabs the registration measurement registers (default 300).",
      "BENCH_PROFILE=<dir> makes every server process write a CPU profile there.",
      "BENCH_HEAP_PROFILE=<dir> samples what every server process allocates (garbage included) over each measured window",
      "  whose label holds BENCH_HEAP_WINDOW (default all), one sample per BENCH_HEAP_INTERVAL bytes (default 4096).",
      "IDLE_SOCKETS sets the idle suite's sockets per path (default 10000), IDLE_SOCKETS_PER_USER how many share a user (default 10),",
      "  IDLE_TOPIC_SIZE its /v0/ws participants per topic (default 20), IDLE_OPEN_SECONDS how long a path may take to open them (default 60),",
      "  IDLE_TARGETS which targets it measures (plain,embedded,distributed) and IDLE_PATHS which paths (/extension,/mcp,/hub,/tabs,/v0/ws; all by default),",
      "  IDLE_HEAP_SNAPSHOTS=<dir> where it writes a heap snapshot of each process before and after,",
      "  IDLE_GCS the full GCs before each reading (default 1; 0 reads an unforced process), IDLE_STARTUP_GC=1 one GC before the warm-up",
      "  all the same (a process's startup garbage), IDLE_WARM the warm-up's sockets (default 100)."
    ].join("\n")
  )
  process.exit(wanted.includes("--help") || wanted.includes("-h") ? 0 : 2)
}

const program = Effect.forEach(wanted.length === 0 ? Object.keys(suites) : wanted, (s) => suites[s] ?? onDemand[s] ?? Effect.void, { discard: true })
Effect.runPromise(program).then(
  () => process.exit(0),
  (e: unknown) => {
    console.error(e)
    process.exit(1)
  }
)
