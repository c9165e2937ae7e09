/**
 * The official MCP conformance suite's `dns-rebinding-protection` scenario against `npm start` as
 * shipped, with no settings: a `Host`/`Origin` of another name must get a 4xx, a loopback one a
 * 2xx. The suite needs Node >= 22, so it runs on the `node` package's binary from test/peers (see
 * libs/testing/src/Peers.ts; never the project's runtime), and it sends no token, so a loopback proxy adds one
 * and passes every other header (Host and Origin above all) through unchanged.
 */
import { describe, expect, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import { execFile } from "node:child_process"
import { mkdtempSync, readdirSync, readFileSync, statSync } from "node:fs"
import * as Http from "node:http"
import type * as Net from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { conformanceDir, node22 } from "@switchboard/testing"
import * as Processes from "./support/Processes.ts"
import { namespace, token } from "./support/Stack.ts"

const root = fileURLToPath(new URL("../../", import.meta.url))
const suite = join(conformanceDir, (JSON.parse(readFileSync(join(conformanceDir, "package.json"), "utf8")) as { bin: Record<string, string> }).bin["conformance"] ?? "")

/** A loopback proxy to `port` that adds `authorization` to each request and changes nothing else. */
const authorizingProxy = (port: number, authorization: string) =>
  Effect.acquireRelease(
    Effect.async<Http.Server>((resume) => {
      const server = Http.createServer((req, res) => {
        const upstream = Http.request({ host: "127.0.0.1", port, method: req.method, path: req.url, headers: { ...req.headers, authorization }, agent: false }, (answer) => {
          res.writeHead(answer.statusCode ?? 502, answer.headers)
          answer.pipe(res)
        })
        upstream.on("error", () => res.destroy())
        req.pipe(upstream)
      })
      server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
    }),
    (server) => Effect.async<void>((resume) => {
      server.close(() => resume(Effect.void))
      server.closeAllConnections()
    })
  ).pipe(Effect.map((server) => (server.address() as Net.AddressInfo).port))

interface Check {
  readonly id: string
  readonly status: string
  readonly errorMessage?: string
}

/** Every `checks.json` the suite wrote under `dir`. */
const checksIn = (dir: string): ReadonlyArray<Check> =>
  readdirSync(dir).flatMap((name) => {
    const path = join(dir, name)
    if (statSync(path).isDirectory()) return checksIn(path)
    return name === "checks.json" ? (JSON.parse(readFileSync(path, "utf8")) as ReadonlyArray<Check>) : []
  })

describe("MCP conformance suite", () => {
  it.scopedLive("dns-rebinding-protection passes against npm start with no settings", () =>
    Effect.gen(function*() {
      const edge = yield* Processes.allInOne({ namespace: namespace() })
      const port = yield* authorizingProxy(edge.port, `Bearer ${yield* token({ sub: "conformance" })}`)
      const out = mkdtempSync(join(tmpdir(), "sb-conformance-"))
      const run = yield* Effect.async<{ readonly code: number; readonly output: string }>((resume) => {
        const child = execFile(
          node22,
          [suite, "server", "--url", `http://127.0.0.1:${port}/hub`, "--scenario", "dns-rebinding-protection", "-o", out],
          { cwd: root, timeout: 60_000, env: { PATH: process.env["PATH"] ?? "", HOME: process.env["HOME"] ?? tmpdir() } },
          (error, stdout, stderr) => resume(Effect.succeed({ code: error === null ? 0 : typeof error.code === "number" ? error.code : 1, output: `${stdout}\n${stderr}` }))
        )
        return Effect.sync(() => void child.kill())
      })
      const checks = checksIn(out)
      expect(checks.map((c) => c.id).sort(), run.output).toEqual(["localhost-host-rebinding-rejected", "localhost-host-valid-accepted"])
      expect(checks.filter((c) => c.status !== "SUCCESS"), run.output).toEqual([])
      expect(run.code, run.output).toBe(0)
    }), { timeout: 120_000 })
})
