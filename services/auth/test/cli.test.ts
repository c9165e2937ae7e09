/**
 * `npm run token` as an operator runs it: a real child process, its stdout decoded as a JWT. Extra
 * claims keep their JSON types, and `connection_url` (which puts a Blueprint MCP client in proxy
 * mode) stays a string.
 */
import { describe, expect, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import { decodeJwt } from "jose"
import { execFile } from "node:child_process"
import { fileURLToPath } from "node:url"

const root = fileURLToPath(new URL("../../..", import.meta.url))

interface Run {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
}

// Only the secret: settings such as SWITCHBOARD_JWT_USER_CLAIM in the caller's shell must not change what is minted.
const env = {
  ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("SWITCHBOARD_"))),
  SWITCHBOARD_JWT_SECRET: "a-secret-long-enough-for-hs256-tokens"
}

const token = (...args: ReadonlyArray<string>) => tokenWith({}, ...args)

/** `npm run token` with more settings than the secret. */
const tokenWith = (settings: Readonly<Record<string, string>>, ...args: ReadonlyArray<string>) =>
  Effect.async<Run>((resume) => {
    const child = execFile(
      process.execPath,
      ["--import", "tsx", "services/auth/src/cli.ts", ...args],
      { cwd: root, env: { ...env, ...settings } },
      (error, stdout, stderr) => resume(Effect.succeed({ code: error === null ? 0 : Number(error.code ?? 1), stdout, stderr }))
    )
    return Effect.sync(() => child.kill())
  })

describe("npm run token", () => {
  it.live("adds --claim values with their JSON types, keeping URLs as strings", () =>
    Effect.gen(function*() {
      const run = yield* token("--sub", "alice", "--claim", "connection_url=wss://x", "--claim", "n=3", "--claim", "flag=true")
      expect(run).toMatchObject({ code: 0, stderr: "" })
      const payload = decodeJwt(run.stdout.trim())
      expect(payload).toMatchObject({ sub: "alice", connection_url: "wss://x", n: 3, flag: true })
      expect([typeof payload["connection_url"], typeof payload["n"], typeof payload["flag"]]).toEqual(["string", "number", "boolean"])
    }))

  it.live("mints a peer's token with user_id and no sub", () =>
    Effect.gen(function*() {
      const run = yield* token("--claim", "user_id=83898119-db4f-4848-9d27-ea328b73a4df")
      expect(run.code).toBe(0)
      const payload = decodeJwt(run.stdout.trim())
      expect(payload.sub).toBeUndefined()
      expect(payload["user_id"]).toBe("83898119-db4f-4848-9d27-ea328b73a4df")
    }))

  it.live("refuses to override a reserved claim, and to mint a token without a user", () =>
    Effect.gen(function*() {
      const [reserved, nobody] = yield* Effect.all([token("--sub", "alice", "--claim", "sub=x"), token("--claim", "n=1")], {
        concurrency: "unbounded"
      })
      expect(reserved.code).toBe(2)
      expect(reserved.stdout).toBe("")
      expect(reserved.stderr).toContain("token: --claim cannot set sub: sub, exp, iat, nbf, iss and aud are reserved")
      expect(nobody.code).toBe(2)
      expect(nobody.stderr).toContain("token: token has no user claim (sub or user_id)")
    }))

  it.live("mints within SWITCHBOARD_JWT_MAX_LIFETIME: the default ttl is cut to it, a longer --ttl is refused", () =>
    Effect.gen(function*() {
      const max = { SWITCHBOARD_JWT_MAX_LIFETIME: "30m" }
      const [plain, cut, long] = yield* Effect.all([token("--sub", "alice"), tokenWith(max, "--sub", "alice"), tokenWith(max, "--sub", "alice", "--ttl", "2h")], {
        concurrency: "unbounded"
      })
      const life = (run: Run) => {
        const payload = decodeJwt(run.stdout.trim())
        return (payload.exp ?? 0) - (payload.iat ?? 0)
      }
      expect(plain.code).toBe(0)
      expect(life(plain)).toBe(3600)
      expect(cut).toMatchObject({ code: 0, stderr: "" })
      expect(life(cut)).toBe(1800)
      expect(long.code).toBe(2)
      expect(long.stdout).toBe("")
      expect(long.stderr).toContain("token: ttl 2h is longer than SWITCHBOARD_JWT_MAX_LIFETIME (30m)")
    }))

  it.live("--help describes --claim with the connection_url example", () =>
    Effect.gen(function*() {
      const run = yield* token("--help")
      expect(run.code).toBe(0)
      expect(run.stdout).toContain("--claim <key>=<value>")
      expect(run.stdout).toContain("--claim connection_url=wss://")
    }))
})
