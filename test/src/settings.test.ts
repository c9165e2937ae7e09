// `npm start` with a bad setting: refused before the banner and the dev token, with one line a
// person can act on and exit code 1; and a duration typed as `5s` starts it.
import { describe, expect, it } from "@effect/vitest"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import { spawn } from "node:child_process"
import { fileURLToPath } from "node:url"

const repoRoot = fileURLToPath(new URL("../../", import.meta.url))

interface Run {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/** Runs the all-in-one until it exits, or until a stdout line matches `until` (then stops it). */
const allInOne = (env: Record<string, string>, until?: RegExp) =>
  Effect.gen(function*() {
    const done = yield* Deferred.make<Run>()
    const child = yield* Effect.acquireRelease(
      Effect.sync(() =>
        spawn(process.execPath, ["--import", "tsx", "services/all-in-one/src/main.ts"], {
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
})
