/**
 * `npm run bench [-- suite ...]`: prints one JSON line per measurement (msgs/s, p50/p99 µs, server
 * RSS and CPU per message), each suite measured against its baselines in the same run.
 * Suites: edge. NATS comes from the same testcontainer the tests use.
 */
import { NatsServer } from "@switchboard/testing"
import * as Effect from "effect/Effect"
import { type ChildProcess, spawn } from "node:child_process"
import { readFileSync } from "node:fs"
import { fileURLToPath } from "node:url"
import { run, type Shape } from "./load.ts"

const serversFile = fileURLToPath(new URL("./servers.ts", import.meta.url))
const SECONDS = Number(process.env["BENCH_SECONDS"] ?? 3)
const WARMUP = 0.5
const shapes: ReadonlyArray<readonly [string, Shape]> = [
  ["1x1", { clients: 1, inFlight: 1 }],
  ["50x10", { clients: 50, inFlight: 10 }]
]

interface Server {
  readonly port: number
  readonly child: ChildProcess
}

const startServer = (kind: string, env: Record<string, string>) =>
  Effect.acquireRelease(
    Effect.async<Server, Error>((resume) => {
      const child = spawn(process.execPath, ["--import", "tsx", serversFile, kind], {
        env: { ...process.env, LOG_LEVEL: "warning", PORT: "0", SWITCHBOARD_JWT_SECRET: "bench-secret", ...env },
        stdio: ["ignore", "pipe", "inherit"]
      })
      let out = ""
      child.stdout.on("data", (chunk: Buffer) => {
        out += chunk.toString()
        const m = /READY (\d+)/.exec(out)
        if (m) resume(Effect.succeed({ port: Number(m[1]), child }))
      })
      child.once("exit", (code) => resume(Effect.fail(new Error(`${kind} server exited with ${code} before it was ready`))))
    }),
    ({ child }) =>
      Effect.async<void>((resume) => {
        if (child.exitCode !== null) return resume(Effect.void)
        child.once("exit", () => resume(Effect.void))
        child.kill("SIGTERM")
      })
  )

/** Resident memory (MB) and CPU time (µs) of a process, from /proc. */
const usage = (pid: number) => {
  const status = readFileSync(`/proc/${pid}/status`, "utf8")
  const rssKb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0)
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ")
  const ticks = Number(stat[11]) + Number(stat[12])
  return { rssMb: Math.round(rssKb / 102.4) / 10, cpuUs: (ticks / 100) * 1e6 }
}

const measure = (suite: string, target: string, kind: string, env: Record<string, string>, path: string) =>
  Effect.scoped(
    Effect.gen(function*() {
      const server = yield* startServer(kind, env)
      const results = []
      for (const [shapeName, shape] of shapes) {
        const before = usage(server.child.pid!)
        const r = yield* Effect.promise(() =>
          run({ url: `ws://127.0.0.1:${server.port}${path}`, shape, seconds: SECONDS, warmupSeconds: WARMUP })
        )
        const after = usage(server.child.pid!)
        const line = {
          suite,
          target,
          shape: shapeName,
          msgs_per_s: r.msgsPerSec,
          p50_us: r.p50Us,
          p99_us: r.p99Us,
          server_rss_mb: after.rssMb,
          server_cpu_us_per_msg: Math.round(((after.cpuUs - before.cpuUs) / Math.max(1, r.count)) * 10) / 10
        }
        results.push(line)
      }
      return results
    })
  )

const edgeSuite = Effect.gen(function*() {
  const { url } = yield* NatsServer
  const nats = { NATS_URL: url }
  const lines = [
    ...(yield* measure("edge", "plain-ws-echo", "plain", {}, "/")),
    ...(yield* measure("edge", "switchboard-embedded", "edge", {}, "/echo")),
    ...(yield* measure("edge", "hand-written-nats-relay", "relay", nats, "/")),
    ...(yield* measure("edge", "switchboard-nats", "edge", nats, "/echo"))
  ]
  for (const line of lines) {
    const base = lines.find((l) => l.target === "plain-ws-echo" && l.shape === line.shape)!
    console.log(JSON.stringify({ ...line, ratio_to_plain: Math.round((line.msgs_per_s / base.msgs_per_s) * 100) / 100 }))
  }
})

const suites: Record<string, Effect.Effect<void, unknown, NatsServer>> = { edge: edgeSuite }

const wanted = process.argv.slice(2).filter((a) => a !== "--")
const unknown = wanted.filter((s) => !(s in suites))
if (wanted.includes("--help") || wanted.includes("-h") || unknown.length > 0) {
  console.log(`Usage: npm run bench [-- ${Object.keys(suites).join(" | ")} ...]\n\nPrints JSON lines: msgs/s, p50/p99 µs, server RSS and CPU per message.\nBENCH_SECONDS sets the measured seconds per shape (default 3).`)
  process.exit(unknown.length > 0 ? 2 : 0)
}

const program = Effect.forEach(wanted.length === 0 ? Object.keys(suites) : wanted, (s) => suites[s]!, { discard: true })
Effect.runPromise(Effect.provide(program, NatsServer.layer)).then(
  () => process.exit(0),
  (e: unknown) => {
    console.error(e)
    process.exit(1)
  }
)
