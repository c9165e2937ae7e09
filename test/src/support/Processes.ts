/**
 * Switchboard services as real OS processes, for tests that cross process boundaries. Each one is
 * a scoped resource: SIGTERM when its scope closes, SIGKILL if it outlives a grace period, and its
 * output kept so a failure can say why. `deployment` starts auth, router, edges and optionally the
 * tool registry in one fresh namespace, and returns once an MCP client can complete a handshake
 * through every edge.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import * as Data from "effect/Data"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import { bundleArgs, type BundledService } from "@switchboard/testing"
import * as Client from "./Client.ts"
import { namespace as freshNamespace, SECRET, token } from "./Stack.ts"

export type Service = BundledService

export class ServiceProcessError extends Data.TaggedError("ServiceProcessError")<{
  readonly reason: "Spawn" | "Exited" | "NotReady"
  readonly service: string
  /** What the process printed, for the failure message. */
  readonly output: string
  readonly cause?: unknown
}> {
  override get message(): string {
    const why = this.cause instanceof Error ? this.cause.message : this.cause === undefined ? "" : String(this.cause)
    return `${this.service}: ${this.reason}${why === "" ? "" : ` (${why})`}\n--- output ---\n${this.output}`
  }
}

export interface ProcessExit {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
}

export interface ServiceProcess {
  readonly service: Service
  readonly pid: number
  /** stdout and stderr so far (the last 64 KiB), stderr lines marked. */
  readonly output: () => string
  /** Sends a signal. It does not wait: `exited` says when the process is gone. */
  readonly kill: (signal?: NodeJS.Signals) => Effect.Effect<void>
  readonly exited: Effect.Effect<ProcessExit>
}

export interface EdgeProcess extends ServiceProcess {
  readonly id: string
  readonly port: number
  /** `http://127.0.0.1:<port>`, as the edge logs it. */
  readonly url: string
  /** `ws://127.0.0.1:<port>`, for sockets. */
  readonly ws: string
}

export interface ProcessOptions {
  /** Unset: the embedded bus (the all-in-one only). */
  readonly natsUrl?: string
  readonly namespace: string
  /** Node's own flags, before the script (e.g. `--inspect=127.0.0.1:0`). */
  readonly nodeArgs?: ReadonlyArray<string>
  /** More settings, on top of the ones every service gets here. */
  readonly env?: Readonly<Record<string, string>>
  /** How long the process gets to exit after SIGTERM before SIGKILL. */
  readonly grace?: Duration.DurationInput
  readonly startTimeout?: Duration.DurationInput
}

const repoRoot = fileURLToPath(new URL("../../../", import.meta.url))
const OUTPUT_LIMIT = 64 * 1024
// eslint-disable-next-line no-control-regex -- colour codes start with ESC; the logger adds them on a TTY
const ANSI = /\x1b\[[0-9;]*m/g
const LISTENING = /edge (\S+) listening on (http:\/\/[^\s:]+:(\d+))/
/** `Actors.host` logs this once the service's open subscription and replica heartbeat are in place. */
const HOSTING = /registry: hosting connection actors/
const BROKER_HOSTING = /broker: hosting connection actors/

/** Children that are still running, killed if this process exits before their scopes close. */
const running = new Set<ChildProcess>()
let exitHookInstalled = false
const killOrphansOnExit = () => {
  if (exitHookInstalled) return
  exitHookInstalled = true
  process.once("exit", () => {
    for (const child of running) child.kill("SIGKILL")
  })
}

/** Only what node needs from this environment: the parent's NATS_URL or OTEL settings must not leak in. */
const baseEnv = (): Record<string, string> =>
  Object.fromEntries(
    ["PATH", "HOME", "TMPDIR", "LANG"].flatMap((k) => {
      const v = process.env[k]
      return v === undefined ? [] : [[k, v]]
    })
  )

/**
 * Starts `services/<service>/src/main.ts`, bundled as the image ships it (`bundleArgs`). With `ready`, returns once a line of its stdout matches,
 * with that match; fails with the process's output if it exits first or takes too long.
 */
const start = (service: Service, options: ProcessOptions, ready?: RegExp) =>
  Effect.gen(function*() {
    const readyLine = yield* Deferred.make<RegExpExecArray | undefined, ServiceProcessError>()
    const exited = yield* Deferred.make<ProcessExit>()
    let output = ""
    const append = (text: string) => {
      output = (output + text).slice(-OUTPUT_LIMIT)
    }

    const child = yield* Effect.acquireRelease(
      Effect.sync(() => {
        killOrphansOnExit()
        const child = spawn(process.execPath, [...(options.nodeArgs ?? []), ...bundleArgs(service)], {
          cwd: repoRoot,
          env: {
            ...baseEnv(),
            ...(options.natsUrl === undefined ? {} : { NATS_URL: options.natsUrl }),
            PORT: "0",
            // Processes of many tests share this machine: the default 9464 would be taken by the first.
            METRICS_PORT: "0",
            SWITCHBOARD_JWT_SECRET: SECRET,
            SWITCHBOARD_NAMESPACE: options.namespace,
            LOG_LEVEL: "info",
            ...options.env
          },
          stdio: ["ignore", "pipe", "pipe"]
        })
        running.add(child)
        let partial = ""
        child.stdout?.setEncoding("utf8").on("data", (chunk: string) => {
          const text = chunk.replace(ANSI, "")
          append(text)
          if (ready === undefined) return
          const lines = (partial + text).split("\n")
          partial = lines.pop() ?? ""
          for (const line of lines) {
            const m = ready.exec(line)
            if (m !== null) Deferred.unsafeDone(readyLine, Effect.succeed(m))
          }
        })
        child.stderr?.setEncoding("utf8").on("data", (chunk: string) => {
          append(chunk.replace(ANSI, "").split("\n").map((l) => (l === "" ? l : `[stderr] ${l}`)).join("\n"))
        })
        child.once("error", (cause) =>
          Deferred.unsafeDone(readyLine, Effect.fail(new ServiceProcessError({ reason: "Spawn", service, output, cause }))))
        // `close` rather than `exit`: by then stdout and stderr are read to the end.
        child.once("close", (code, signal) => {
          running.delete(child)
          Deferred.unsafeDone(exited, Effect.succeed({ code, signal }))
          Deferred.unsafeDone(
            readyLine,
            Effect.fail(new ServiceProcessError({ reason: "Exited", service, output, cause: `exit code ${code}, signal ${signal}` }))
          )
        })
        return child
      }),
      (child) =>
        Effect.gen(function*() {
          if (child.exitCode !== null || child.signalCode !== null) return
          child.kill("SIGTERM")
          const stopped = yield* Deferred.await(exited).pipe(Effect.timeout(options.grace ?? "5 seconds"), Effect.option)
          if (stopped._tag === "Some") return
          child.kill("SIGKILL")
          yield* Deferred.await(exited).pipe(Effect.timeout("5 seconds"), Effect.ignore)
        })
    )
    if (ready === undefined) yield* Deferred.succeed(readyLine, undefined)

    // Generous: a cold tsx start of several services on two busy cores takes a while.
    const timeout = options.startTimeout ?? "60 seconds"
    const match = yield* Deferred.await(readyLine).pipe(
      Effect.timeoutFail({
        duration: timeout,
        onTimeout: () =>
          new ServiceProcessError({ reason: "NotReady", service, output, cause: `no line matching ${ready} within ${Duration.format(Duration.decode(timeout))}` })
      })
    )
    const proc: ServiceProcess = {
      service,
      pid: child.pid ?? -1,
      output: () => output,
      kill: (signal = "SIGTERM") => Effect.sync(() => void child.kill(signal)),
      exited: Deferred.await(exited)
    }
    return { proc, match }
  })

/** The auth service. It is ready once it answers `auth.verify`, which `deployment` checks. */
export const auth = (options: ProcessOptions) => Effect.map(start("auth", options), ({ proc }) => proc)

/** The session router. It is ready once it takes connections, which `deployment` checks. */
export const router = (options: ProcessOptions) => Effect.map(start("router", options), ({ proc }) => proc)

/**
 * The tool registry (`/tabs`, `/hub`), returned once it hosts connection actors: from then on an
 * edge's open request for either path finds it. It asks the router for tabs (`createTab`).
 */
export const registry = (options: ProcessOptions) => Effect.map(start("registry", options, HOSTING), ({ proc }) => proc)

/** The MCPx broker, returned once it hosts connection actors (and so sequences topics). */
export const broker = (options: ProcessOptions) => Effect.map(start("broker", options, BROKER_HOSTING), ({ proc }) => proc)

/** Where a process serves its metrics (`METRICS_PORT`, 0 in tests), from the line it logs at start. */
export const metricsUrl = (proc: ServiceProcess) =>
  Effect.suspend(() => {
    const m = /metrics on (http:\/\/[^\s/"]+)\/metrics/.exec(proc.output())
    return m?.[1] === undefined ? Effect.fail(`${proc.service} has not logged its metrics port yet`) : Effect.succeed(m[1])
  }).pipe(
    // A process under tsx on a loaded machine has been seen silent for its first 20 s.
    Effect.retry(Schedule.spaced("50 millis").pipe(Schedule.upTo("60 seconds"))),
    Effect.orElse(() => Effect.dieMessage(`${proc.service} never logged its metrics port:\n${proc.output()}`))
  )

/** A process that serves an edge, returned once it logs the port it listens on. */
const listening = (service: "edge" | "all-in-one", options: ProcessOptions) =>
  Effect.flatMap(start(service, options, LISTENING), ({ match, proc }) => {
    const [line = "", id, url, port] = match ?? []
    if (id === undefined || url === undefined || port === undefined) {
      return Effect.fail(new ServiceProcessError({ reason: "NotReady", service, output: proc.output(), cause: `unexpected line ${line}` }))
    }
    return Effect.succeed<EdgeProcess>({ ...proc, id, port: Number(port), url, ws: url.replace(/^http/, "ws") })
  })

/** One edge, returned once it logs the port it listens on. */
export const edge = (options: ProcessOptions) => listening("edge", options)

/** Every service in one process (`npm start`), on the embedded bus unless `natsUrl` is given. */
export const allInOne = (options: ProcessOptions) => listening("all-in-one", options)

export interface Deployment {
  readonly namespace: string
  readonly auth: ServiceProcess
  readonly router: ServiceProcess
  /** Present when the deployment was asked for it (`DeploymentOptions.registry`). */
  readonly registry?: ServiceProcess
  /** Every registry replica, the first being `registry`. */
  readonly registries: ReadonlyArray<ServiceProcess>
  readonly edges: ReadonlyArray<EdgeProcess>
}

export interface DeploymentOptions {
  readonly edges: number
  /** Also start the tool registry, and wait until it hosts connection actors. */
  readonly registry?: boolean
  /** How many registry replicas, when `registry` (1 unless given). */
  readonly registries?: number
  readonly env?: Readonly<Record<string, string>>
  readonly readyTimeout?: Duration.DurationInput
}

/** The deployment does not serve yet; `detail` says what the last probe saw. */
class NotYet extends Data.TaggedError("NotYet")<{ readonly detail: string }> {}

const decodeHandshake = Schema.decodeUnknownEither(
  Schema.parseJson(Schema.Struct({ id: Schema.Literal(1), result: Schema.Struct({ authenticated: Schema.Literal(true) }) }))
)

/** One `mcp_handshake` through the edge, on a socket of its own: it proves edge → router → auth. */
const handshakeThrough = (edge: EdgeProcess, accessToken: string) =>
  Effect.scoped(
    Effect.gen(function*() {
      const c = yield* Client.connect(`${edge.ws}/mcp`).pipe(Effect.mapError((e) => new NotYet({ detail: e.message })))
      c.send({ jsonrpc: "2.0", id: 1, method: "mcp_handshake", params: { accessToken } })
      const closed = Deferred.await(c.closed).pipe(
        Effect.flatMap(({ code, reason }) => Effect.fail(new NotYet({ detail: `closed ${code} ${reason}` })))
      )
      const reply = yield* Effect.raceFirst(Queue.take(c.messages), closed).pipe(
        Effect.timeoutFail({ duration: "3 seconds", onTimeout: () => new NotYet({ detail: "no answer to mcp_handshake within 3s" }) })
      )
      // Until auth answers, the router refuses the handshake with an error.
      if (decodeHandshake(reply)._tag === "Left") return yield* Effect.fail(new NotYet({ detail: reply }))
    })
  )

/**
 * Auth, router, `edges` edges and, if asked, the registry as separate processes on one NATS, in a
 * namespace of their own. Returns once every edge listens, an MCP handshake succeeds through each
 * of them, and the registry (if any) hosts connection actors.
 */
export const deployment = (natsUrl: string, options: DeploymentOptions) =>
  Effect.gen(function*() {
    const namespace = freshNamespace()
    const common: ProcessOptions = { natsUrl, namespace, ...(options.env === undefined ? {} : { env: options.env }) }
    const [authProc, routerProc, registries, edges] = yield* Effect.all(
      [
        auth(common),
        router(common),
        Effect.all(Array.from({ length: options.registry === true ? options.registries ?? 1 : 0 }, () => registry(common)), { concurrency: "unbounded" }),
        Effect.all(Array.from({ length: options.edges }, () => edge(common)), { concurrency: "unbounded" })
      ],
      { concurrency: "unbounded" }
    )
    const registryProc = registries[0]
    const services = [authProc, routerProc, ...registries, ...edges]
    const probe = yield* token({ sub: `readiness-${namespace}` })
    const lastProbe = { detail: "not tried" }
    const serving = Effect.forEach(
      edges,
      (e) =>
        handshakeThrough(e, probe).pipe(
          Effect.tapError((err) => Effect.sync(() => (lastProbe.detail = `${e.url}: ${err.detail}`))),
          Effect.retry(Schedule.spaced("200 millis"))
        ),
      { concurrency: "unbounded", discard: true }
    )
    // A service that dies while we wait fails the wait at once, with its output.
    const died = Effect.raceAll(services.map((p) => Effect.map(p.exited, (exit) => [p, exit] as const))).pipe(
      Effect.flatMap(([p, exit]) =>
        Effect.fail(new ServiceProcessError({ reason: "Exited", service: p.service, output: p.output(), cause: `exit code ${exit.code}, signal ${exit.signal}` }))
      )
    )
    const timeout = options.readyTimeout ?? "30 seconds"
    yield* Effect.raceFirst(serving, died).pipe(
      Effect.timeoutFail({
        duration: timeout,
        onTimeout: () =>
          new ServiceProcessError({
            reason: "NotReady",
            service: "deployment",
            output: services.map((p) => `${"id" in p ? `edge ${p.id}` : p.service}:\n${p.output()}`).join("\n"),
            cause: `no MCP handshake through every edge within ${Duration.format(Duration.decode(timeout))}; last: ${lastProbe.detail}`
          })
      })
    )
    return {
      namespace,
      auth: authProc,
      router: routerProc,
      ...(registryProc === undefined ? {} : { registry: registryProc }),
      registries,
      edges
    } satisfies Deployment
  })
