/**
 * `npm run peer:claude-code [-- --keep]`: Claude Code, as a new user runs it, against `/hub` of
 * `npm start`. It installs `@anthropic-ai/claude-code` (pinned; a 400 MB native binary, so a script
 * and not a test) into a throwaway directory, starts the all-in-one on a free port, puts a
 * recording proxy in front of `/hub`, adds the server with `claude mcp add --transport http` under
 * a throwaway HOME with no API key, and runs `claude mcp list`, which connects to every server.
 * It prints what Claude Code sent and what it was answered, and fails unless the server shows as
 * connected on MCP 2026-07-28 with `server/discover` answered and no `initialize` (no fallback).
 */
import { execFile, execFileSync, spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import * as Net from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"

const VERSION = "2.1.332"
const root = fileURLToPath(new URL("../..", import.meta.url))

if (process.argv.includes("--help")) {
  console.log("Usage: npm run peer:claude-code [-- --keep]\n\nRuns Claude Code " + VERSION + " against /hub of npm start and checks it speaks MCP 2026-07-28 with no fallback.\n  --keep   leave the throwaway directory (Claude Code's install and HOME) in place")
  process.exit(0)
}

const freePort = () =>
  new Promise<number>((resolve) => {
    const server = Net.createServer()
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as AddressInfo
      server.close(() => resolve(port))
    })
  })

const work = mkdtempSync(join(tmpdir(), "sb-claude-code-"))
const home = join(work, "home")
execFileSync("mkdir", ["-p", home])
console.log(`installing @anthropic-ai/claude-code@${VERSION} into ${work} …`)
// Its postinstall only copies the platform's binary over a placeholder; the binary is run directly.
execFileSync("npm", ["install", "--no-save", "--ignore-scripts", "--no-audit", "--no-fund", "--prefix", work, `@anthropic-ai/claude-code@${VERSION}`], { stdio: "inherit" })
const claude = join(work, "node_modules", "@anthropic-ai", `claude-code-${process.platform}-${process.arch}`, "claude")

const port = await freePort()
const metricsPort = await freePort()
const secret = "claude-code-script-secret-of-32-bytes!"
const env = { ...process.env, PORT: String(port), METRICS_PORT: String(metricsPort), SWITCHBOARD_JWT_SECRET: secret, LOG_LEVEL: "warn" }
const server = spawn("npx", ["tsx", "services/all-in-one/src/main.ts"], { cwd: root, env, stdio: ["ignore", "inherit", "inherit"] })
server.once("exit", (code) => {
  if (code !== null && code !== 0) {
    console.error(`npm start exited with ${code}`)
    process.exit(1)
  }
})
const stop = () => {
  server.kill("SIGTERM")
  if (!process.argv.includes("--keep")) rmSync(work, { recursive: true, force: true })
}

for (let i = 0; ; i++) {
  const ready = await fetch(`http://127.0.0.1:${port}/readyz`).then((r) => r.ok, () => false)
  if (ready) break
  if (i > 300) throw new Error("npm start was not ready within 60 s")
  await new Promise((r) => setTimeout(r, 200))
}
const token = execFileSync("npx", ["tsx", "services/auth/src/cli.ts", "--sub", "claude-code-user"], { cwd: root, env }).toString().trim()

/** What Claude Code sent to /hub and what it got: one line per request. */
const recorded: Array<{ readonly http: string; readonly method: string; readonly headers: Record<string, string>; readonly status: number }> = []
const proxy = Http.createServer((req, res) => {
  if (process.env["DEBUG_PROXY"] !== undefined) console.error(`proxy: ${req.method} ${req.url} ${JSON.stringify(req.headers)}`)
  const chunks: Array<Buffer> = []
  req.on("data", (c: Buffer) => chunks.push(c))
  req.on("end", () => {
    const body = Buffer.concat(chunks)
    let method = ""
    try {
      method = String((JSON.parse(body.toString() || "{}") as { method?: unknown }).method ?? "")
    } catch {
      method = "(not JSON)"
    }
    const headers = Object.fromEntries(Object.entries(req.headers).filter(([k]) => k.startsWith("mcp-")).map(([k, v]) => [k, String(v)]))
    const upstream = Http.request({ host: "127.0.0.1", port, method: req.method, path: req.url, headers: req.headers }, (answer) => {
      recorded.push({ http: `${req.method} ${req.url}`, method, headers, status: answer.statusCode ?? 0 })
      res.writeHead(answer.statusCode ?? 502, answer.headers)
      answer.pipe(res)
    })
    upstream.on("error", () => res.destroy())
    upstream.end(body)
  })
})
await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve))
const url = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}/hub`

/** Claude Code, run asynchronously: the recording proxy lives in this process's event loop. */
const run = (args: ReadonlyArray<string>) =>
  new Promise<string>((resolve, reject) =>
    execFile(claude, args, { env: { PATH: process.env["PATH"] ?? "", HOME: home }, cwd: home, timeout: 120_000 }, (error, stdout, stderr) =>
      error === null ? resolve(stdout) : reject(new Error(`claude ${args.join(" ")}: ${error.message}\n${stdout}\n${stderr}`))
    )
  )

let ok = false
try {
  console.log(await run(["mcp", "add", "--transport", "http", "switchboard", url, "--header", `Authorization: Bearer ${token}`]))
  const list = await run(["mcp", "list"])
  console.log(list)
  for (const line of recorded) console.log(JSON.stringify(line))
  const discovered = recorded.some((r) => r.method === "server/discover" && r.status === 200 && r.headers["mcp-protocol-version"] === "2026-07-28")
  const initialized = recorded.some((r) => r.method === "initialize")
  const connected = /switchboard:.*Connected/i.test(list)
  console.log(JSON.stringify({ claudeCode: VERSION, connected, serverDiscoverAnswered: discovered, initializeSent: initialized }))
  ok = connected && discovered && !initialized
} finally {
  proxy.close()
  stop()
}
process.exit(ok ? 0 : 1)
