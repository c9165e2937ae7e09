/**
 * The mcpx suite: chat fan-out in one MCPx topic of 100 participants, five of them publishing at
 * stepped total rates (open loop, see room.ts), against the all-in-one process on its embedded bus
 * and against auth, broker and three edges as processes of their own on NATS. The rates double
 * past the listed ones until a step fails (p99 ≥ 50 ms, or deliveries fall behind), and a `knee`
 * line names the highest rate that passed: a ceiling, not just a threshold. A goal line per target
 * says whether it met 50,000 deliveries a second with p99 under 50 ms.
 *
 * The mcpx-crowd suite is the same ladder in one topic of 1,000 participants (BENCH_CROWD_SIZE).
 */
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
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
const rates = (list: string) => list.split(",").map(Number).filter((r) => r > 0)
/**
 * Total chats per second offered, one step each (BENCH_MCPX_RATES=100,250,... to probe further);
 * 500 is the goal's 50,000 deliveries a second. Past the last, the rate doubles until a step
 * fails or the next would pass BENCH_MCPX_MAX_RATE: that bounds the steps' count, as SECONDS
 * bounds each one's length.
 */
const ROOM = {
  name: "mcpx",
  topic: "bench-room",
  participants: 100,
  publishers: 5,
  rates: rates(process.env["BENCH_MCPX_RATES"] ?? "100,250,500,1000"),
  maxRate: Number(process.env["BENCH_MCPX_MAX_RATE"] ?? 64_000)
} as const
/**
 * One topic of 1,000: each chat costs a thousand deliveries, so the ladder starts at 2 chats a
 * second (2,000 deliveries) and doubles from there; on a loaded shared machine even 10 missed
 * p99 < 50 ms.
 */
const CROWD = {
  name: "mcpx-crowd",
  topic: "bench-crowd",
  participants: Number(process.env["BENCH_CROWD_SIZE"] ?? 1000),
  publishers: 5,
  rates: rates(process.env["BENCH_CROWD_RATES"] ?? "2"),
  maxRate: Number(process.env["BENCH_CROWD_MAX_RATE"] ?? 1_000)
} as const

export interface RoomShape {
  /** The suite, as the lines name it. */
  readonly name: string
  readonly topic: string
  readonly participants: number
  readonly publishers: number
  /** Offered chats/s, one step each; then doubling from the last, up to `maxRate`. */
  readonly rates: ReadonlyArray<number>
  readonly maxRate: number
}
/** An unreported first step at a low rate: warms the JIT and waits out the join presence. */
const WARMUP = { rate: 100, seconds: 1 } as const
const DRAIN_SECONDS = 3
/** A step stops once p99 is sure to exceed this, and no higher rate is tried after it. */
const GIVE_UP_MS = 1000
const GOAL = { deliveriesPerSec: 50_000, p99Us: 50_000 }
/** Deliveries in the window trail the sends by the latency; this much short still counts as keeping up. */
const KEPT_UP = 0.97

/**
 * The broker's per-participant budgets (envelopes and chats, each 100/s with a burst of 200 by
 * default) are sized for people; at 1,000 chats/s each of five publishers sends 200/s. They are
 * lifted, as are the edge's frame limits, so that the steps measure fan-out; every line says so
 * with `rate_limits: "lifted"`, and a refusal stops the step. So are the caps on sockets per address
 * (all of the bench's come from 127.0.0.1) and on a topic's participants, for the crowd.
 */
export const lifted = {
  ...unlimited,
  EDGE_MAX_CONNECTIONS_PER_ADDRESS: "0",
  MCPX_MAX_PARTICIPANTS: "1000000",
  MCPX_RATE: "1000000000",
  MCPX_BURST: "1000000000",
  MCPX_CHAT_RATE: "1000000000",
  MCPX_CHAT_BURST: "1000000000"
} as const

export interface Target {
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

const lineOf = (shape: RoomShape, target: Target, rate: number, r: StepResult, opened: Snapshot, closed: Snapshot): Line => ({
  suite: shape.name,
  target: target.name,
  participants: shape.participants,
  publishers: shape.publishers,
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

/**
 * Why a step did not keep up with its offered rate within the latency bound, or undefined when it
 * did: everything delivered, in one order, nothing refused or closed, p99 under 50 ms.
 */
const failure = (shape: RoomShape, rate: number, r: StepResult): string | undefined => {
  const why = [
    r.stopped === undefined ? undefined : `stopped early: ${r.stopped}`,
    r.p99Us < GOAL.p99Us ? undefined : `p99 ${finite(r.p99Us) ?? "∞"} µs ≥ ${GOAL.p99Us} µs`,
    r.undelivered === 0 ? undefined : `${r.undelivered} undelivered`,
    r.misordered === 0 ? undefined : `${r.misordered} misordered`,
    r.refused === 0 && r.closed === 0 ? undefined : `${r.refused} refused, ${r.closed} closed`,
    // Sends are whole chats on a schedule: each publisher may be one short as the window closes.
    r.sent + shape.publishers >= KEPT_UP * rate * r.seconds ? undefined : `sent only ${Math.round(r.sent / r.seconds)}/s: the bench fell behind its schedule`,
    r.delivered >= KEPT_UP * r.sent * shape.participants ? undefined : `delivered ${Math.round(r.delivered / r.seconds)}/s, behind the ${Math.round((r.sent / r.seconds) * shape.participants)}/s owed`
  ].filter((w) => w !== undefined)
  return why.length === 0 ? undefined : why.join("; ")
}

/** The listed rates, then doubling from the last while at most `maxRate`. */
const ladder = function*(shape: RoomShape) {
  yield* shape.rates
  for (let rate = (shape.rates[shape.rates.length - 1] ?? 50) * 2; rate <= shape.maxRate; rate *= 2) yield rate
}

/**
 * The steps against one running target, printed as they finish, up to the first that fails; then
 * the knee (the highest offered rate that passed) and whether it met the goal.
 */
export const measureRoom = (shape: RoomShape, target: Target) =>
  Effect.gen(function*() {
    const participants = yield* Effect.forEach(
      Array.from({ length: shape.participants }, (_, i) => `p${i}`),
      (id) => Effect.map(issueToken({ sub: id, ttl: "1 hour" }), (token) => ({ id, token }))
    )
    const joinStart = performance.now()
    const room = yield* Effect.acquireRelease(
      Effect.tryPromise(() => openRoom({ urls: target.urls, topic: shape.topic, participants, publishers: shape.publishers })),
      (room) => Effect.sync(room.close)
    )
    const joinSeconds = (performance.now() - joinStart) / 1000
    yield* Effect.tryPromise(() => room.step({ ...WARMUP, drainSeconds: DRAIN_SECONDS, giveUpMs: GIVE_UP_MS }))
    const met: Array<number> = []
    let best = 0
    let knee: { readonly rate: number; readonly r: StepResult } | undefined
    let failed: { readonly rate: number; readonly why: string } | undefined
    for (const rate of ladder(shape)) {
      const window = measuredWindow(() => snapshot(target), `${shape.name} ${target.name} ${rate}/s`)
      const r = yield* Effect.tryPromise(() =>
        room.step({ rate, seconds: SECONDS, drainSeconds: DRAIN_SECONDS, giveUpMs: GIVE_UP_MS, onWindow: window.onWindow })
      )
      print(lineOf(shape, target, rate, r, window.opened(), window.closed()))
      const why = failure(shape, rate, r)
      if (why === undefined && rate * shape.participants >= GOAL.deliveriesPerSec) met.push(rate)
      if (r.p99Us < GOAL.p99Us && r.undelivered === 0) best = Math.max(best, Math.round(r.delivered / r.seconds))
      if (why !== undefined) {
        failed = { rate, why }
        break
      }
      knee = { rate, r }
    }
    print({
      suite: shape.name,
      target: target.name,
      measure: "knee",
      participants: shape.participants,
      join_seconds: round1(joinSeconds),
      knee_offered_msgs_per_s: knee?.rate ?? null,
      knee_deliveries_per_s: knee === undefined ? null : Math.round(knee.r.delivered / knee.r.seconds),
      knee_p50_us: finite(knee?.r.p50Us ?? NaN),
      knee_p99_us: finite(knee?.r.p99Us ?? NaN),
      first_failing_offered_msgs_per_s: failed?.rate ?? null,
      failed_because: failed?.why ?? `none up to ${shape.maxRate}/s (BENCH_*_MAX_RATE)`
    })
    print({
      suite: shape.name,
      target: target.name,
      goal: `>= ${GOAL.deliveriesPerSec} deliveries/s, all delivered in one order, p99 < ${GOAL.p99Us / 1000} ms`,
      met: met.length > 0,
      met_at_offered_msgs_per_s: met.length > 0 ? met.join(",") : null,
      best_deliveries_per_s_under_p99_goal: best
    })
  })

const embedded = <E>(use: (target: Target) => Effect.Effect<void, E, Scope.Scope>) => Effect.scoped(
  Effect.flatMap(
    startService("all-in-one", "services/all-in-one/src/main.ts", lifted, [Ready.edge, Ready.broker]),
    (s) => use({ name: "switchboard-embedded", urls: [wsUrl(s, "")], groups: [["server", [s]]], measured: [s] })
  )
)

/**
 * Auth, broker and three edges on NATS. `server_*` is those five; NATS (in its container, found
 * by its port) is reported apart as `nats_*`, since the embedded target has no counterpart.
 */
export const distributed = <E>(use: (target: Target) => Effect.Effect<void, E, Scope.Scope>) => withNats((natsUrl) =>
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
    return yield* use({
      name: "switchboard-distributed",
      urls: edges.map((e) => wsUrl(e, "")),
      groups: [["server", servers], ["broker", [broker]], ["edges", edges], ...(nats === undefined ? [] : [["nats", [nats]] as const])],
      measured: nats === undefined ? servers : [...servers, nats]
    })
  }))
)

export const mcpxSuite = Effect.gen(function*() {
  yield* embedded((target) => measureRoom(ROOM, target))
  yield* distributed((target) => measureRoom(ROOM, target))
})

export const mcpxCrowdSuite = Effect.gen(function*() {
  yield* embedded((target) => measureRoom(CROWD, target))
  yield* distributed((target) => measureRoom(CROWD, target))
})
