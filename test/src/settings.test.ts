// `npm start` with a bad setting: refused before the banner and the dev token, with one line a
// person can act on and exit code 1; and a duration typed as `5s` starts it. A service run as a
// process of its own refuses the same way.
import { describe, expect, it } from "@effect/vitest"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import { spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import { NatsServer } from "@switchboard/testing"
import { namespace } from "./support/Stack.ts"

const repoRoot = fileURLToPath(new URL("../../", import.meta.url))

interface Run {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/** Runs a service's main until it exits, or until a stdout line matches `until` (then stops it). */
const runMain = (main: string, env: Record<string, string>, until?: RegExp) =>
  Effect.gen(function*() {
    const done = yield* Deferred.make<Run>()
    const child = yield* Effect.acquireRelease(
      Effect.sync(() =>
        spawn(process.execPath, ["--import", "tsx", main], {
          cwd: repoRoot,
          env: { PATH: process.env.PATH ?? "", PORT: "0", LOG_FORMAT: "logfmt", ...env },
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

const allInOne = (env: Record<string, string>, until?: RegExp) => runMain("services/all-in-one/src/main.ts", env, until)

describe("settings at start", () => {
  it.scopedLive("refuses EDGE_MAX_PAYLOAD=-1 with one line on stderr, before the dev token", () =>
    Effect.gen(function*() {
      const run = yield* allInOne({ EDGE_MAX_PAYLOAD: "-1" })
      expect(run.code).toBe(1)
      const lines = run.stderr.split("\n").filter((l) => l.trim() !== "")
      expect(lines).toStrictEqual(["switchboard: EDGE_MAX_PAYLOAD must be a whole number > 0, got -1"])
      expect(run.stdout).not.toContain("Development token")
    }), 20_000)

  it.scopedLive("refuses a burst below its rate, naming both", () =>
    Effect.gen(function*() {
      const run = yield* allInOne({ MCPX_RATE: "1000" })
      expect(run.code).toBe(1)
      expect(run.stderr.trim()).toBe("switchboard: MCPX_BURST must be at least MCPX_RATE (1000), got 200")
      expect(run.stdout).not.toContain("Development token")
    }), 20_000)

  it.scopedLive("starts with EDGE_SHUTDOWN_GRACE=5s", () =>
    Effect.gen(function*() {
      const run = yield* allInOne({ EDGE_SHUTDOWN_GRACE: "5s" }, /listening on /)
      expect(run.stdout).toMatch(/listening on /)
      expect(run.stderr).toBe("")
    }), 20_000)

  it.scopedLive("an edge run on its own refuses EDGE_MAX_PAYLOAD=-1 with one line and exit code 1", () =>
    Effect.gen(function*() {
      const { url } = yield* NatsServer
      const run = yield* runMain("services/edge/src/main.ts", { NATS_URL: url, SWITCHBOARD_NAMESPACE: namespace(), EDGE_MAX_PAYLOAD: "-1" })
      expect(run.code).toBe(1)
      const lines = run.stderr.split("\n").filter((l) => l.trim() !== "")
      expect(lines).toStrictEqual(["switchboard-edge: EDGE_MAX_PAYLOAD must be a whole number > 0, got -1"])
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 60_000)
})
