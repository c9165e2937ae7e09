/**
 * The mcpx-topics suite: many small topics, the case the broker's journal design must survive.
 * BENCH_TOPICS topics (5,000) of BENCH_TOPIC_SIZE participants (5) join the distributed target,
 * their members dealt over its three edges; the line says how long that took and what each topic
 * costs in resident memory in the broker, NATS and the edges. Then each topic's first member chats
 * in turn at BENCH_TOPICS_RATE chats/s in all (open loop), and the line says deliveries/s, p50/p99.
 * The join time and RSS per topic are over the topics after the first `warm_topics`.
 *
 * 25,000 sockets do not fit in one process under this machine's file-descriptor limit (20,000,
 * hard), so the sockets live in load processes (topicsWorker.ts) of at most SOCKETS_PER_WORKER
 * each, every topic whole in one of them so that one clock times its chats.
 */
import * as Effect from "effect/Effect"
import { type ChildProcess, spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import { distributed, type Target } from "./mcpx.ts"
import { bundle, costs, measuredWindow, sample, usage } from "./processes.ts"
import { print, round1 } from "./report.ts"
import { merge, percentileOf, type TopicsCommand, type TopicsReply } from "./topicsWire.ts"

const TOPICS = Number(process.env["BENCH_TOPICS"] ?? 5000)
const SIZE = Number(process.env["BENCH_TOPIC_SIZE"] ?? 5)
/** Chats per second offered over all topics together (one every 5 s per topic at the defaults). */
const RATE = Number(process.env["BENCH_TOPICS_RATE"] ?? 1000)
const SECONDS = Number(process.env["BENCH_SECONDS"] ?? 3)
const DRAIN_SECONDS = 3
/** Handshakes in flight at once over all load processes: bounded, as a crowd reconnecting would be by backoff. */
const IN_FLIGHT = Number(process.env["BENCH_TOPICS_IN_FLIGHT"] ?? 32)
/** Half the descriptor limit: each socket is one descriptor, and the process needs some of its own. */
const SOCKETS_PER_WORKER = 10_000
/** Joined before the measured joins (see below), and not counted in them. */
const WARM_TOPICS = Math.min(100, Math.floor(TOPICS / 10))
/** Time for the work joins set off (KV writes, presence fan-out) to finish before RSS is read. */
const SETTLE_MS = 2_000

const workerFile = fileURLToPath(new URL("./topicsWorker.ts", import.meta.url))

interface Worker {
  readonly request: (command: TopicsCommand) => Promise<TopicsReply>
  readonly child: ChildProcess
}

/** A load process for as long as the scope lives; one request at a time, answered in order. */
const startWorker = (index: number) =>
  Effect.acquireRelease(
    Effect.async<Worker, Error>((resume) => {
      const child = spawn(process.execPath, ["--enable-source-maps", bundle(workerFile)], { stdio: ["ignore", "inherit", "inherit", "ipc"] })
      let pending: { readonly resolve: (r: TopicsReply) => void; readonly reject: (e: Error) => void } | undefined
      const request = (command: TopicsCommand) =>
        new Promise<TopicsReply>((resolve, reject) => {
          pending = { resolve, reject }
          child.send(command)
        })
      child.on("message", (reply: TopicsReply) => {
        if (reply.type === "ready") return resume(Effect.succeed({ request, child }))
        const p = pending
        pending = undefined
        if (reply.type === "failed") p?.reject(new Error(`load process ${index}: ${reply.error}`))
        else p?.resolve(reply)
      })
      child.once("exit", (code) => {
        pending?.reject(new Error(`load process ${index} exited with ${code}`))
        resume(Effect.fail(new Error(`load process ${index} exited with ${code} before it was ready`)))
      })
    }),
    ({ child }) =>
      Effect.async<void>((resume) => {
        if (child.exitCode !== null || child.signalCode !== null) return resume(Effect.void)
        child.once("exit", () => resume(Effect.void))
        child.kill("SIGTERM")
      })
  )

const expect = <T extends TopicsReply["type"]>(reply: TopicsReply, type: T): Extract<TopicsReply, { readonly type: T }> => {
  if (reply.type !== type) throw new Error(`expected ${type} from a load process, got ${reply.type}`)
  return reply as Extract<TopicsReply, { readonly type: T }>
}

const finite = (us: number) => (Number.isFinite(us) ? Math.round(us) : null)

const measureTopics = (target: Target) =>
  Effect.gen(function*() {
    const workers = yield* Effect.forEach(
      Array.from({ length: Math.max(1, Math.ceil((TOPICS * SIZE) / SOCKETS_PER_WORKER)) }, (_, i) => i),
      startWorker
    )
    // Whole topics, in blocks as even as they come.
    const blocks = workers.map((worker, w) => {
      const first = Math.floor((w * TOPICS) / workers.length)
      return { worker, first, topics: Math.floor(((w + 1) * TOPICS) / workers.length) - first }
    })
    const topicPrefix = `bench-t${process.pid}-`

    const join = (upTo: (topics: number) => number) =>
      Effect.forEach(
        blocks,
        ({ worker, first, topics }) =>
          Effect.tryPromise(() =>
            worker.request({
              type: "join",
              urls: target.urls,
              topicPrefix,
              firstTopic: first,
              topics,
              size: SIZE,
              inFlight: Math.max(1, Math.round(IN_FLIGHT / workers.length)),
              upTo: upTo(topics)
            })
          ).pipe(Effect.map((r) => expect(r, "joined"))),
        { concurrency: "unbounded" }
      )
    // A few topics first, not counted: the first ones also pay for code compiled and buffers grown once.
    yield* join((topics) => Math.min(topics, Math.ceil(WARM_TOPICS / workers.length)))
    yield* Effect.sleep(SETTLE_MS)
    const warmed = blocks.reduce((sum, b) => sum + Math.min(b.topics, Math.ceil(WARM_TOPICS / workers.length)), 0)
    const before = sample(target.groups)
    const joined = yield* join((topics) => topics)
    const joinSeconds = Math.max(...joined.map((r) => r.seconds))
    yield* Effect.sleep(SETTLE_MS)
    const after = sample(target.groups)
    print({
      suite: "mcpx-topics",
      target: target.name,
      measure: "join",
      topics: TOPICS,
      participants_per_topic: SIZE,
      sockets: TOPICS * SIZE,
      load_processes: workers.length,
      warm_topics: warmed,
      join_seconds: round1(joinSeconds),
      joins_per_s: Math.round(((TOPICS - warmed) * SIZE) / joinSeconds),
      join_retries: joined.reduce((sum, r) => sum + r.retries, 0),
      joins_in_flight: IN_FLIGHT,
      ...Object.fromEntries(target.groups.flatMap(([key], i) => [
        [`${key}_rss_mb`, after[i]?.rssMb ?? null],
        [`${key}_rss_kb_per_topic`, round1((((after[i]?.rssMb ?? 0) - (before[i]?.rssMb ?? 0)) * 1024) / Math.max(1, TOPICS - warmed))]
      ]))
    })

    // CPU over sending and the drain: a load process answers once its chats are all delivered.
    const window = measuredWindow(() => sample(target.groups), `mcpx-topics ${target.name} ${RATE}/s`)
    const machine = usage(target.measured)
    window.onWindow("open")
    const chatted = yield* Effect.forEach(
      blocks,
      ({ worker, topics }) =>
        Effect.tryPromise(() => worker.request({ type: "chat", rate: (RATE * topics) / TOPICS, seconds: SECONDS, drainSeconds: DRAIN_SECONDS }))
          .pipe(Effect.map((r) => expect(r, "chatted"))),
      { concurrency: "unbounded" }
    )
    window.onWindow("close")
    const seconds = Math.max(...chatted.map((r) => r.seconds))
    const sum = (f: (r: (typeof chatted)[number]) => number) => chatted.reduce((a, r) => a + f(r), 0)
    const buckets = merge(chatted.map((r) => r.buckets))
    const undelivered = sum((r) => r.undelivered)
    const sent = sum((r) => r.sent)
    print({
      suite: "mcpx-topics",
      target: target.name,
      measure: "chat",
      topics: TOPICS,
      participants_per_topic: SIZE,
      offered_msgs_per_s: RATE,
      sent_msgs_per_s: Math.round(sent / seconds),
      deliveries_per_s: Math.round(sum((r) => r.delivered) / seconds),
      p50_us: finite(percentileOf(buckets, 50)),
      p99_us: finite(percentileOf(buckets, 99)),
      undelivered,
      refused: sum((r) => r.refused),
      closed: sum((r) => r.closed),
      seconds: round1(seconds),
      ...costs(target.groups, window.opened(), window.closed(), sent * SIZE - undelivered, "delivery"),
      bench_cpu_pct: Math.round(sum((r) => r.benchCpuUs) / (seconds * 1e6) * 100),
      measured_cpu_s: round1((usage(target.measured).cpuUs - machine.cpuUs) / 1e6),
      rate_limits: "lifted"
    })
    yield* Effect.forEach(workers, (w) => Effect.promise(() => w.request({ type: "close" })), { concurrency: "unbounded" })
  })

export const mcpxTopicsSuite = distributed(measureTopics)
