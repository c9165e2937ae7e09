// `npm start` with a bad setting: refused before the banner and the dev token, with one line a
// person can act on and exit code 1; and a duration typed as `5s` starts it. A service run as a
// process of its own refuses the same way. What stops a start later (a port in use, a HOST that
// does not resolve, NATS out of reach) is one line too, and risky settings get a warning.
import { describe, expect, it } from "@effect/vitest"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import { spawn } from "node:child_process"
import * as Net from "node:net"
import { fileURLToPath } from "node:url"
import { bundleArgs, type BundledService as Service, NatsServer } from "@switchboard/testing"
import { namespace } from "./support/Stack.ts"

const repoRoot = fileURLToPath(new URL("../../", import.meta.url))

interface Run {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/**
 * How a service is started: bundled, as the image ships it and the other process tests run it, or
 * literally as `npm start` does (`tsx`), which one test keeps so that the README's command is run.
 */
const bundled = (service: Service) => [process.execPath, ...bundleArgs(service)] as const
const npmStart = [fileURLToPath(new URL("../../node_modules/.bin/tsx", import.meta.url)), "services/all-in-one/src/main.ts"] as const

/** Runs a service until it exits, or until a stdout line matches `until` (then stops it). */
const runMain = (command: readonly [string, ...ReadonlyArray<string>], env: Record<string, string>, until?: RegExp) =>
  Effect.gen(function*() {
    const done = yield* Deferred.make<Run>()
    const child = yield* Effect.acquireRelease(
      Effect.sync(() =>
        spawn(command[0], command.slice(1), {
          cwd: repoRoot,
          env: { PATH: process.env.PATH ?? "", PORT: "0", METRICS_PORT: "0", LOG_FORMAT: "logfmt", ...env },
          stdio: ["ignore", "pipe", "pipe"]
        })
      ),
      (child) => Effect.sync(() => child.exitCode === null && child.kill("SIGKILL"))
    )
    let stdout = ""
    let stderr = ""
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => {
      stdout += chunk
      if (until?.test(stdout) === true) child.kill("SIGTERM")
    })
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => {
      stderr += chunk
    })
    child.on("close", (code) => Deferred.unsafeDone(done, Effect.succeed({ code, stdout, stderr })))
    return yield* Deferred.await(done)
  })

const allInOne = (env: Record<string, string>, until?: RegExp) => runMain(bundled("all-in-one"), env, until)

describe("settings at start", () => {
  it.scopedLive("refuses EDGE_MAX_PAYLOAD=-1 with one line on stderr, before the dev token", () =>
    Effect.gen(function*() {
      const run = yield* allInOne({ EDGE_MAX_PAYLOAD: "-1" })
      expect(run.code).toBe(1)
      const lines = run.stderr.split("\n").filter((l) => l.trim() !== "")
      expect(lines).toStrictEqual(["switchboard: EDGE_MAX_PAYLOAD must be a whole number > 0, got -1"])
      expect(run.stdout).not.toContain("Development token")
    }), 20_000)

  it.scopedLive("refuses an OTEL_EXPORTER_OTLP_ENDPOINT that is no http URL, before the dev token", () =>
    Effect.gen(function*() {
      const run = yield* allInOne({ OTEL_EXPORTER_OTLP_ENDPOINT: "collector:4318" })
      expect(run.code).toBe(1)
      expect(run.stderr.trim()).toBe('switchboard: OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or https:// URL, got "collector:4318"')
      expect(run.stdout).not.toContain("Development token")
    }), 20_000)

  it.scopedLive("refuses a burst below its rate, naming both", () =>
    Effect.gen(function*() {
      const run = yield* allInOne({ MCPX_RATE: "1000" })
      expect(run.code).toBe(1)
      expect(run.stderr.trim()).toBe("switchboard: MCPX_BURST must be at least MCPX_RATE (1000), got 200")
      expect(run.stdout).not.toContain("Development token")
    }), 20_000)

  it.scopedLive("refuses LOG_LEVEL=loud naming the variable once, before the dev token", () =>
    Effect.gen(function*() {
      const run = yield* allInOne({ LOG_LEVEL: "loud" })
      expect(run.code).toBe(1)
      expect(run.stderr.trim()).toBe("switchboard: LOG_LEVEL must be trace, debug, info, warning, error or none, got loud")
      expect(run.stdout).not.toContain("Development token")
    }), 20_000)

  it.scopedLive("starts with EDGE_SHUTDOWN_GRACE=5s, run as npm start runs it", () =>
    Effect.gen(function*() {
      const run = yield* runMain(npmStart, { EDGE_SHUTDOWN_GRACE: "5s" }, /listening on /)
      expect(run.stdout).toMatch(/listening on /)
      expect(run.stderr).toBe("")
    }), 20_000)

  it.scopedLive("refuses SWITCHBOARD_JWT_REQUIRE_EXP=maybe, naming what it takes", () =>
    Effect.gen(function*() {
      const run = yield* allInOne({ SWITCHBOARD_JWT_REQUIRE_EXP: "maybe" })
      expect(run.code).toBe(1)
      expect(run.stderr.trim()).toBe("switchboard: SWITCHBOARD_JWT_REQUIRE_EXP must be true or false, got maybe")
      expect(run.stdout).not.toContain("Development token")
    }), 20_000)

  it.scopedLive("with SWITCHBOARD_JWT_MAX_LIFETIME shorter than a day, the dev token lives that long, not 24h", () =>
    Effect.gen(function*() {
      const run = yield* allInOne({ SWITCHBOARD_JWT_MAX_LIFETIME: "2h" }, /listening on /)
      expect(run.stdout).toContain("Development token (sub=dev, privilege=full, admin, valid 2h):")
      const token = /^\s+(ey\S+)$/m.exec(run.stdout)?.[1] ?? ""
      const claims = JSON.parse(Buffer.from(token.split(".")[1] ?? "", "base64url").toString()) as { exp: number; iat: number }
      expect(claims.exp - claims.iat).toBe(2 * 3600)
    }), 20_000)

  it.scopedLive("an edge run on its own refuses EDGE_MAX_PAYLOAD=-1 with one line and exit code 1", () =>
    Effect.gen(function*() {
      const { url } = yield* NatsServer
      const run = yield* runMain(bundled("edge"), { NATS_URL: url, SWITCHBOARD_NAMESPACE: namespace(), EDGE_MAX_PAYLOAD: "-1" })
      expect(run.code).toBe(1)
      const lines = run.stderr.split("\n").filter((l) => l.trim() !== "")
      expect(lines).toStrictEqual(["switchboard-edge: EDGE_MAX_PAYLOAD must be a whole number > 0, got -1"])
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)
})

describe("start-up failures and warnings", () => {
  /** The non-empty lines of a run's stderr. */
  const errorLines = (run: Run) => run.stderr.split("\n").filter((l) => l.trim() !== "")

  it.scopedLive("a port in use is one line naming PORT, with exit code 1", () =>
    Effect.gen(function*() {
      const taken = yield* Effect.acquireRelease(
        Effect.async<Net.Server>((resume) => {
          const server = Net.createServer().listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
        }),
        (server) => Effect.sync(() => server.close())
      )
      const port = (taken.address() as Net.AddressInfo).port
      const run = yield* allInOne({ HOST: "127.0.0.1", PORT: String(port) })
      expect(run.code).toBe(1)
      expect(errorLines(run)).toStrictEqual([`switchboard: cannot listen on 127.0.0.1:${port}: the port is in use (set PORT to a free port)`])
      // Before anything starts: no service says it runs, and no dev token for a server that never listened.
      expect(run.stdout).not.toMatch(/hosting connection actors|answering token verification|Development token|metrics on/)
    }), 20_000)

  it.scopedLive("a METRICS_PORT in use is one line naming METRICS_PORT, for npm start and for a service alone", () =>
    Effect.gen(function*() {
      const taken = yield* Effect.acquireRelease(
        Effect.async<Net.Server>((resume) => {
          const server = Net.createServer().listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
        }),
        (server) => Effect.sync(() => server.close())
      )
      const port = (taken.address() as Net.AddressInfo).port
      const line = `cannot listen on 127.0.0.1:${port}: the port is in use (set METRICS_PORT to a free port)`
      const run = yield* allInOne({ HOST: "127.0.0.1", METRICS_PORT: String(port) })
      expect(run.code).toBe(1)
      expect(errorLines(run)).toStrictEqual([`switchboard: ${line}`])
      const alone = yield* runMain(bundled("auth"), { HOST: "127.0.0.1", METRICS_PORT: String(port), SWITCHBOARD_JWT_SECRET: "x".repeat(32) })
      expect(alone.code).toBe(1)
      expect(errorLines(alone)).toStrictEqual([`switchboard-auth: ${line}`])
    }), 30_000)

  it.scopedLive("a HOST that does not resolve is one line naming HOST, with exit code 1", () =>
    Effect.gen(function*() {
      const run = yield* allInOne({ HOST: "no-such-host.invalid" })
      expect(run.code).toBe(1)
      const lines = errorLines(run)
      expect(lines).toHaveLength(1)
      expect(lines[0]).toMatch(/^switchboard: HOST=no-such-host\.invalid does not resolve \((ENOTFOUND|EAI_AGAIN)\); set HOST to an address or name of this machine/)
    }), 20_000)

  it.scopedLive("a NATS_URL nobody answers is one line naming NATS_URL, with exit code 1, for npm start and for a service alone", () =>
    Effect.gen(function*() {
      const closed = yield* Effect.async<number>((resume) => {
        // A port that was just free: nobody listens on it.
        const server = Net.createServer().listen(0, "127.0.0.1", () => {
          const { port } = server.address() as Net.AddressInfo
          server.close(() => resume(Effect.succeed(port)))
        })
      })
      const url = `nats://127.0.0.1:${closed}`
      for (const [service, name] of [["all-in-one", "switchboard"], ["router", "switchboard-router"]] as const) {
        const run = yield* runMain(bundled(service), { NATS_URL: url, SWITCHBOARD_JWT_SECRET: "a-secret-that-is-long-enough-for-hs256-x" })
        expect(run.code).toBe(1)
        expect(errorLines(run)).toStrictEqual([`${name}: cannot connect to NATS at ${url}: connection refused (NATS_URL)`])
      }
    }), 40_000)

  it.scopedLive("a weak SWITCHBOARD_JWT_SECRET gets a warning at start", () =>
    Effect.gen(function*() {
      const example = yield* allInOne({ SWITCHBOARD_JWT_SECRET: "change-me" }, /listening on /)
      expect(example.stdout).toMatch(/level=WARN .*SWITCHBOARD_JWT_SECRET is weak \(the example value\)/)
      const short = yield* allInOne({ SWITCHBOARD_JWT_SECRET: "only-twenty-bytes-xx" }, /listening on /)
      expect(short.stdout).toMatch(/level=WARN .*SWITCHBOARD_JWT_SECRET is weak \(20 bytes\)/)
      const strong = yield* allInOne({ SWITCHBOARD_JWT_SECRET: "x".repeat(32) }, /listening on /)
      expect(strong.stdout).not.toContain("is weak")
    }), 40_000)

  it.scopedLive("a service started alone without NATS_URL warns that its embedded bus is private", () =>
    Effect.gen(function*() {
      const run = yield* runMain(bundled("router"), { SWITCHBOARD_JWT_SECRET: "x".repeat(32) }, /hosting connection actors/)
      expect(run.stdout).toMatch(/level=WARN .*NATS_URL is not set: switchboard-router runs on a private embedded bus that no other process can reach/)
      const all = yield* allInOne({}, /listening on /)
      expect(all.stdout).not.toContain("private embedded bus")
    }), 40_000)
})
