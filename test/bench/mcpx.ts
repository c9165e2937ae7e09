/**
 * The mcpx suite: chat fan-out in one MCPx topic of 100 participants, five of them publishing at
 * stepped total rates (open loop, see room.ts), against the all-in-one process on its embedded bus
 * and against auth, broker and three edges as processes of their own on NATS. A last line per
 * target says whether it met the goal: 50,000 deliveries a second with p99 under 50 ms.
 */
import * as Effect from "effect/Effect"
import {
  costs,
  type Groups,
  issueToken,
  machineCpuUs,
  natsProcess,
  type Measured,
  measuredWindow,
  Ready,
  sample,
  type Started,
  startService,
  unlimited,
  usage,
  type Usage,
  withNats,
  wsUrl
} from "./processes.ts"
import { type Line, print, round1 } from "./report.ts"
import { openRoom, type StepResult } from "./room.ts"

const SECONDS = Number(process.env["BENCH_SECONDS"] ?? 3)
const PARTICIPANTS = 100
const PUBLISHERS = 5
/**
 * Total chats per second offered, one step each (BENCH_MCPX_RATES=100,250,... to probe further);
 * 500 is the goal's 50,000 deliveries a second.
 */
const RATES: ReadonlyArray<number> = (process.env["BENCH_MCPX_RATES"] ?? "100,250,500,1000")
  .split(",")
  .map(Number)
  .filter((r) => r > 0)
/** An unreported first step at a low rate: warms the JIT and waits out the join presence. */
const WARMUP = { rate: 100, seconds: 1 } as const
const DRAIN_SECONDS = 3
/** A step stops once p99 is sure to exceed this, and no higher rate is tried after it. */
const GIVE_UP_MS = 1000
const GOAL = { deliveriesPerSec: 50_000, p99Us: 50_000 }
/** Deliveries in the window trail the sends by the latency; this much short still counts as keeping up. */
const KEPT_UP = 0.97
const TOPIC = "bench-room"

/**
 * The broker's per-participant budgets (envelopes and chats, each 100/s with a burst of 200 by
 * default) are sized for people; at 1,000 chats/s each of five publishers sends 200/s. They are
 * lifted, as are the edge's frame limits, so that the steps measure fan-out; every line says so
 * with `rate_limits: "lifted"`, and a refusal stops the step.
 */
const lifted = {
  ...unlimited,
  MCPX_RATE: "1000000000",
  MCPX_BURST: "1000000000",
  MCPX_CHAT_RATE: "1000000000",
  MCPX_CHAT_BURST: "1000000000"
} as const

interface Target {
  readonly name: string
  /** Edge base URLs (ws://host:port), dealt to participants in turn. */
  readonly urls: ReadonlyArray<string>
  /** `server` (every process together) first, then any reported apart. */
  readonly groups: Groups
  /** Every process measured, each once: what the machine spent beyond them and the bench was someone else's. */
  readonly measured: ReadonlyArray<Measured>
}

/** Usage as a measured window opens or closes. */
interface Snapshot {
  readonly groups: ReadonlyArray<Usage>
  readonly measuredCpuUs: number
  readonly machineCpuUs: number
}

const snapshot = (target: Target): Snapshot => ({
  groups: sample(target.groups),
  measuredCpuUs: usage(target.measured).cpuUs,
  machineCpuUs: machineCpuUs()
})

const finite = (us: number) => (Number.isFinite(us) ? Math.round(us) : null)

/** The machine's CPU over the window beyond the measured processes and the bench, in % of one core. */
const othersCpuPct = (opened: Snapshot, closed: Snapshot, r: StepResult) => {
  const benchUs = (r.benchCpuPct / 100) * r.seconds * 1e6
  const othersUs = closed.machineCpuUs - opened.machineCpuUs - (closed.measuredCpuUs - opened.measuredCpuUs) - benchUs
  return Math.max(0, Math.round((othersUs / (r.seconds * 1e6)) * 100))
}

const lineOf = (target: Target, rate: number, r: StepResult, opened: Snapshot, closed: Snapshot): Line => ({
  suite: "mcpx",
  target: target.name,
  participants: PARTICIPANTS,
  publishers: PUBLISHERS,
  offered_msgs_per_s: rate,
  sent_msgs_per_s: Math.round(r.sent / r.seconds),
  deliveries_per_s: Math.round(r.delivered / r.seconds),
  p50_us: finite(r.p50Us),
  p99_us: finite(r.p99Us),
  undelivered: r.undelivered,
  misordered: r.misordered,
  gaps: r.gaps,
  refused: r.refused,
  closed: r.closed,
  stopped_early: r.stopped ?? null,
  seconds: round1(r.seconds),
  ...costs(target.groups, opened.groups, closed.groups, r.delivered, "delivery"),
  bench_cpu_pct: Math.round(r.benchCpuPct),
  others_cpu_pct: othersCpuPct(opened, closed, r),
  rate_limits: "lifted"
})

/** Kept up with the goal's load: everything delivered, in one order, within the latency bound. */
const meetsGoal = (rate: number, r: StepResult) =>
  rate * PARTICIPANTS >= GOAL.deliveriesPerSec &&
  r.stopped === undefined &&
  r.undelivered === 0 &&
  r.misordered === 0 &&
  r.refused === 0 &&
  r.delivered / r.seconds >= KEPT_UP * rate * PARTICIPANTS &&
  r.p99Us < GOAL.p99Us

/** The steps against one running target, printed as they finish, then whether it met the goal. */
const measure = (target: Target) =>
  Effect.gen(function*() {
    const participants = yield* Effect.forEach(
      Array.from({ length: PARTICIPANTS }, (_, i) => `p${i}`),
      (id) => Effect.map(issueToken({ sub: id, ttl: "1 hour" }), (token) => ({ id, token }))
    )
    const room = yield* Effect.acquireRelease(
      Effect.tryPromise(() => openRoom({ urls: target.urls, topic: TOPIC, participants, publishers: PUBLISHERS })),
      (room) => Effect.sync(room.close)
    )
    yield* Effect.tryPromise(() => room.step({ ...WARMUP, drainSeconds: DRAIN_SECONDS, giveUpMs: GIVE_UP_MS }))
    const met: Array<number> = []
    let best = 0
    for (const rate of RATES) {
      const window = measuredWindow(() => snapshot(target), `mcpx ${target.name} ${rate}/s`)
      const r = yield* Effect.tryPromise(() =>
        room.step({ rate, seconds: SECONDS, drainSeconds: DRAIN_SECONDS, giveUpMs: GIVE_UP_MS, onWindow: window.onWindow })
      )
      print(lineOf(target, rate, r, window.opened(), window.closed()))
      if (meetsGoal(rate, r)) met.push(rate)
      if (r.p99Us < GOAL.p99Us && r.undelivered === 0) best = Math.max(best, Math.round(r.delivered / r.seconds))
      if (r.stopped !== undefined) break
    }
    print({
      suite: "mcpx",
      target: target.name,
      goal: `>= ${GOAL.deliveriesPerSec} deliveries/s, all delivered in one order, p99 < ${GOAL.p99Us / 1000} ms`,
      met: met.length > 0,
      met_at_offered_msgs_per_s: met.length > 0 ? met.join(",") : null,
      best_deliveries_per_s_under_p99_goal: best
    })
  })

const embedded = Effect.scoped(
  Effect.flatMap(
    startService("all-in-one", "services/all-in-one/src/main.ts", lifted, [Ready.edge, Ready.broker]),
    (s) => measure({ name: "switchboard-embedded", urls: [wsUrl(s, "")], groups: [["server", [s]]], measured: [s] })
  )
)

/**
 * Auth, broker and three edges on NATS. `server_*` is those five; NATS (in its container, found
 * by its port) is reported apart as `nats_*`, since the embedded target has no counterpart.
 */
const distributed = withNats((natsUrl) =>
  Effect.scoped(Effect.gen(function*() {
    // Its own namespace, so that no KV record of another run or suite on this NATS is seen.
    const env = { ...lifted, NATS_URL: natsUrl, SWITCHBOARD_NAMESPACE: `bench${process.pid}` }
    const edge = (name: string) => startService(name, "services/edge/src/main.ts", env, [Ready.edge])
    // Edge A first: the edges and the broker's actor host open the `edges` bucket with different
    // options (TTL or none), and two first-time creators racing make one of them fail to start.
    const edgeA = yield* edge("edge A")
    const [auth, broker, edgeB, edgeC] = yield* Effect.all(
      [
        startService("auth", "services/auth/src/main.ts", env, [Ready.auth]),
        startService("broker", "services/broker/src/main.ts", env, [Ready.broker]),
        edge("edge B"),
        edge("edge C")
      ],
      { concurrency: "unbounded" }
    )
    const edges: ReadonlyArray<Started> = [edgeA, edgeB, edgeC]
    const nats = natsProcess(natsUrl)
    const servers = [auth, broker, ...edges]
    return yield* measure({
      name: "switchboard-distributed",
      urls: edges.map((e) => wsUrl(e, "")),
      groups: [["server", servers], ["broker", [broker]], ["edges", edges], ...(nats === undefined ? [] : [["nats", [nats]] as const])],
      measured: nats === undefined ? servers : [...servers, nats]
    })
  }))
)

export const mcpxSuite = Effect.gen(function*() {
  yield* embedded
  yield* distributed
})
