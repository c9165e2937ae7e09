/**
 * The processes a benchmark measures: servers.ts kinds, the baselines of baselines.ts and the
 * services' own main.ts, each started for as long as a scope lives, and what they cost (RSS and
 * CPU from /proc) over a measured window.
 * Every suite starts its targets through here, so that all of them get the same environment.
 */
import { NatsServer } from "@switchboard/testing"
import * as Effect from "effect/Effect"
import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import { appendFileSync, readdirSync, readFileSync } from "node:fs"
import { basename, dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { freePort, HEAP_PROFILE, heapWindow, inspect } from "./heapSampling.ts"
import { issueToken, SECRET } from "./tokens.ts"

const root = fileURLToPath(new URL("../../", import.meta.url))
const serversFile = fileURLToPath(new URL("./servers.ts", import.meta.url))
const baselinesFile = fileURLToPath(new URL("./baselines.ts", import.meta.url))
/** When set, every server process writes a V8 CPU profile into this folder as it exits. */
const PROFILE = process.env["BENCH_PROFILE"]

/** A process whose usage is measured: one the bench started, or one it found (NATS in its container). */
export interface Measured {
  readonly name: string
  readonly pid: number
}

export interface Started extends Measured {
  readonly child: ChildProcess
  /** The port the process printed, when its ready line carries one. */
  readonly port: number
}

/** A target's settings come from the bench alone: the caller's shell must not leak a NATS or a collector into it. */
const baseEnv = (): NodeJS.ProcessEnv => {
  const env: NodeJS.ProcessEnv = { ...process.env }
  for (const key of ["NATS_URL", "OTEL_EXPORTER_OTLP_ENDPOINT", "SWITCHBOARD_NAMESPACE"]) delete env[key]
  return { ...env, LOG_LEVEL: "warning", PORT: "0", METRICS_PORT: "0", HOST: "127.0.0.1", SWITCHBOARD_JWT_SECRET: SECRET }
}

/**
 * `node <file, bundled> ...args` (see `bundle`) for as long as the scope lives. It is ready once its
 * stdout has matched every pattern; the first capture group seen is its port. Stdout keeps being
 * read after that, since a child blocks once a pipe nobody reads is full.
 */
const startProcess = (
  name: string,
  file: string,
  args: ReadonlyArray<string>,
  env: Readonly<Record<string, string>>,
  ready: ReadonlyArray<RegExp>
) =>
  Effect.acquireRelease(
    Effect.flatMap(Effect.promise(() => (HEAP_PROFILE === undefined ? Promise.resolve(undefined) : freePort())), (inspectPort) =>
    Effect.async<Started, Error>((resume) => {
      const profile = PROFILE === undefined ? [] : ["--cpu-prof", `--cpu-prof-dir=${PROFILE}`]
      const inspector = inspectPort === undefined ? [] : [`--inspect=127.0.0.1:${inspectPort}`]
      const child = spawn(process.execPath, [...profile, ...inspector, "--enable-source-maps", bundle(file), ...args], {
        cwd: root,
        env: { ...baseEnv(), ...env },
        stdio: ["ignore", "pipe", "inherit"]
      })
      let out = ""
      let waiting = true
      child.stdout.on("data", (chunk: Buffer) => {
        if (!waiting) return
        out += chunk.toString()
        if (!ready.every((pattern) => pattern.test(out))) return
        waiting = false
        const port = ready.map((pattern) => pattern.exec(out)?.[1]).find((p) => p !== undefined)
        if (child.pid === undefined) return resume(Effect.fail(new Error(`${name} has no pid`)))
        const pid = child.pid
        for (const dir of [PROFILE, HEAP_PROFILE]) {
          if (dir !== undefined) appendFileSync(`${dir}/processes.jsonl`, `${JSON.stringify({ pid, name, readyAt: Date.now() })}\n`)
        }
        const started = { name, child, pid, port: Number(port ?? 0) }
        if (inspectPort === undefined) return resume(Effect.succeed(started))
        inspect(name, pid, inspectPort).then(() => resume(Effect.succeed(started)), (e: unknown) => resume(Effect.fail(new Error(`${name}: ${String(e)}`))))
      })
      child.once("error", (e) => resume(Effect.fail(e)))
      child.once("exit", (code) => resume(Effect.fail(new Error(`${name} exited with ${code} before it was ready:\n${out}`))))
    })),
    ({ child }) =>
      Effect.async<void>((resume) => {
        if (child.exitCode !== null || child.signalCode !== null) return resume(Effect.void)
        // The edge gives sockets a grace period on SIGTERM; a process stuck past it is not worth waiting for.
        const kill = setTimeout(() => child.kill("SIGKILL"), 15_000)
        child.once("exit", () => {
          clearTimeout(kill)
          resume(Effect.void)
        })
        child.kill("SIGTERM")
      })
  )

/**
 * The bench measures what ships: each entry point bundled as the image bundles it
 * (deploy/bundle.mjs), once per bench run, into a `dist` folder beside its `src` (a service's
 * `dist/main.js` is its build output). Not tsx: it compiles with esbuild's keepNames, which names
 * every closure as it is created, and the hot paths create some per message.
 */
const bundles = new Map<string, string>()
export const bundle = (entry: string): string => {
  let out = bundles.get(entry)
  if (out === undefined) {
    const source = dirname(entry)
    out = join(basename(source) === "src" ? dirname(source) : source, "dist", `${basename(entry, ".ts")}.js`)
    execFileSync(process.execPath, [join(root, "deploy/bundle.mjs"), entry, out], { cwd: root, stdio: "inherit" })
    bundles.set(entry, out)
  }
  return out
}

/** A server kind of servers.ts, or a baseline of baselines.ts (`plain`, `plain-http`); prints `READY <port>`. */
export const startServer = (kind: string, env: Readonly<Record<string, string>> = {}) =>
  startProcess(kind, kind === "plain" || kind === "plain-http" ? baselinesFile : serversFile, [kind], env, [/READY (\d+)/])

/** Ready lines of the services' own main.ts, logged at info. */
export const Ready = {
  edge: /edge \S+ listening on http:\/\/[^\s:]+:(\d+)/,
  router: /router: hosting connection actors/,
  broker: /broker: hosting connection actors/,
  registry: /registry: hosting connection actors/,
  auth: /auth: answering token verification/
} as const

/** A service's own main.ts (a path from the repository root), as it is deployed. */
export const startService = (name: string, main: string, env: Readonly<Record<string, string>>, ready: ReadonlyArray<RegExp>) =>
  startProcess(name, `${root}${main}`, [], { LOG_LEVEL: "info", ...env }, ready)

/**
 * With BENCH_PROFILE, records a measured window on the clock of V8's profiles (CLOCK_MONOTONIC,
 * µs), so that profile.ts can count only the samples taken while a load was measured.
 */
export const profileWindow = () => {
  if (PROFILE === undefined) return (_label: string) => {}
  const from = process.hrtime.bigint() / 1000n
  return (label: string) => {
    const to = process.hrtime.bigint() / 1000n
    appendFileSync(`${PROFILE}/windows.jsonl`, `${JSON.stringify({ label, from: Number(from), to: Number(to) })}\n`)
  }
}

/**
 * A measured window's samples: `take` as the window opens and as it closes, and the window marked
 * in the CPU profiles (under `label`) in between. Its `onWindow` is what a load loop calls.
 */
export const measuredWindow = <S>(take: () => S, label: string) => {
  let opened = take()
  let closed = opened
  let endProfileWindow = (_label: string) => {}
  let endHeapWindow = (_label: string) => {}
  return {
    onWindow: (edge: "open" | "close") => {
      if (edge === "open") {
        endHeapWindow = heapWindow(label)
        opened = take()
        endProfileWindow = profileWindow()
      } else {
        closed = take()
        endProfileWindow(label)
        endHeapWindow(label)
      }
    },
    opened: () => opened,
    closed: () => closed
  }
}

export const wsUrl = (server: Started, path: string) => `ws://127.0.0.1:${server.port}${path}`

/**
 * NATS for the targets that need it, for no longer than they run: concurrent test runs remove
 * leftover testcontainers, and a container held through the whole bench is more likely to go.
 *
 * It gets one core of the two this bench shares among six processes, its share, as a CPU limit
 * sets a pod's (`deploy/k8s/nats.yaml`). With two, Go's scheduler spins on every wakeup: in the
 * distributed proxy at 50×10, nats-server took 18.4-18.5 µs of CPU per message with two and
 * 11.6-12.1 µs with one, in alternating runs.
 */
export const withNats = <A, E>(use: (url: string) => Effect.Effect<A, E>) =>
  Effect.provide(Effect.flatMap(NatsServer, ({ url }) => use(url)), NatsServer.layerWith({ cpus: 1 }))

/**
 * Rate limits are policy sized for people, not for one user keeping 500 requests in flight through
 * one extension socket. They are lifted so that the bench measures forwarding; the budgets are
 * still taken on every frame.
 */
export const unlimited = {
  EDGE_RATE_LIMIT: "1000000000",
  EDGE_RATE_BURST: "1000000000",
  ROUTER_CONNECTION_RATE: "1000000000",
  ROUTER_USER_RATE: "1000000000"
} as const

export { issueToken }

// --- what they cost ------------------------------------------------------------------------

export interface Usage {
  readonly rssMb: number
  readonly cpuUs: number
  /** Read and write system calls (socket I/O included), all threads; NaN when /proc hides them (another user's process). */
  readonly syscalls: number
}

const ioSyscalls = (pid: number) => {
  try {
    const io = readFileSync(`/proc/${pid}/io`, "utf8")
    return Number(/syscr:\s+(\d+)/.exec(io)?.[1] ?? NaN) + Number(/syscw:\s+(\d+)/.exec(io)?.[1] ?? NaN)
  } catch {
    return NaN
  }
}

/** Resident memory (MB), CPU time (µs) and I/O system calls of processes together (all threads), from /proc. */
export const usage = (processes: ReadonlyArray<Measured>): Usage => {
  let rssKb = 0
  let ticks = 0
  let syscalls = 0
  for (const { pid } of processes) {
    rssKb += Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? 0)
    syscalls += ioSyscalls(pid)
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th overall.
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
    ticks += Number(fields[11] ?? 0) + Number(fields[12] ?? 0)
  }
  return { rssMb: Math.round(rssKb / 102.4) / 10, cpuUs: (ticks / 100) * 1e6, syscalls }
}

/**
 * CPU time (µs) every process of the machine has used, from /proc/stat: what is left after the
 * measured processes and the bench is someone else's load, which on a shared machine skews latency.
 */
export const machineCpuUs = () => {
  const [user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0, steal = 0] =
    (readFileSync("/proc/stat", "utf8").split("\n")[0] ?? "").trim().split(/\s+/).slice(1).map(Number)
  return ((user + nice + system + irq + softirq + steal) / 100) * 1e6
}

/** A running process this bench did not start, by its command line (arguments joined by spaces). */
export const findProcess = (name: string, matches: (commandLine: string) => boolean): Measured | undefined => {
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue
    try {
      if (matches(readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0").join(" "))) return { name, pid: Number(entry) }
    } catch {
      // Gone since the listing.
    }
  }
  return undefined
}

/** The nats-server serving `natsUrl` (in its container, seen from the host), if this machine can see it. */
export const natsProcess = (natsUrl: string): Measured | undefined => {
  const port = new URL(natsUrl).port
  const found = findProcess("nats", (command) => command.includes("nats-server") && command.includes(` -p ${port} `))
  if (found === undefined) console.error(`no nats-server process for port ${port} is visible; nats_* is not reported`)
  return found
}

/** The bench process itself: the load generator, and the extension or tab that answers. */
export const benchProcess: Measured = { name: "bench", pid: process.pid }

/** Processes reported together under one key, as `<key>_rss_mb`, `<key>_cpu_us_per_<unit>` and `<key>_syscalls_per_<unit>`. */
export type Groups = ReadonlyArray<readonly [string, ReadonlyArray<Measured>]>

/** Takes every group's usage now, once as a measured window opens and once as it closes. */
export const sample = (groups: Groups): ReadonlyArray<Usage> => groups.map(([, processes]) => usage(processes))

/** Each group's RSS as the window closed, and its CPU and I/O system calls over the window per counted `unit`. */
export const costs = (
  groups: Groups,
  opened: ReadonlyArray<Usage>,
  closed: ReadonlyArray<Usage>,
  count: number,
  unit: string
): Record<string, number> =>
  Object.fromEntries(groups.flatMap(([key], i) => {
    const before = opened[i]
    const after = closed[i]
    if (before === undefined || after === undefined) return []
    const syscalls = (after.syscalls - before.syscalls) / Math.max(1, count)
    return [
      [`${key}_rss_mb`, after.rssMb],
      [`${key}_cpu_us_per_${unit}`, Math.round(((after.cpuUs - before.cpuUs) / Math.max(1, count)) * 10) / 10],
      ...(Number.isNaN(syscalls) ? [] : [[`${key}_syscalls_per_${unit}`, Math.round(syscalls * 100) / 100] as const])
    ] as const
  }))
