/**
 * deploy/compose.yaml as an operator runs it: `up --build` builds deploy/Dockerfile and starts NATS,
 * auth, router, broker, registry and two edges; both edges get ready, the image's `token` command
 * mints a token, and sessions through either edge reach the services behind them. Runs with
 * `docker compose` (v2) or `docker-compose` (v1, Debian's), and is skipped, saying so, with neither.
 * No registry answers here, so the images are local ones (ensureNodeImage, ensureNatsImage).
 */
import { describe, expect, it } from "@effect/vitest"
import { ensureDocker, ensureNatsImage, ensureNodeImage } from "@switchboard/testing"
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import { execFile, spawnSync } from "node:child_process"
import { fileURLToPath } from "node:url"
import { connect } from "./support/Client.ts"
import { freePort } from "./support/FreePort.ts"
import { SECRET } from "./support/Stack.ts"

const root = fileURLToPath(new URL("../../", import.meta.url))
const composeFile = `${root}deploy/compose.yaml`

const answers = (command: ReadonlyArray<string>) => spawnSync(command[0] ?? "", [...command.slice(1), "version"], { encoding: "utf8", timeout: 30_000 }).status === 0
/** The compose command this machine has: the v2 plugin first, then Debian's v1. */
const compose = [["docker", "compose"], ["docker-compose"]].find(answers)
if (compose === undefined) {
  console.warn("compose.test.ts: skipping: neither `docker compose` nor `docker-compose` is installed (apt-get install -y docker-compose)")
}

class CommandFailed extends Data.TaggedError("CommandFailed")<{ readonly command: string; readonly output: string }> {
  override get message(): string {
    return `${this.command} failed:\n${this.output}`
  }
}

const run = (command: ReadonlyArray<string>, env: NodeJS.ProcessEnv, timeoutMs = 180_000) =>
  Effect.async<string, CommandFailed>((resume) => {
    const child = execFile(command[0] ?? "", command.slice(1), { cwd: root, env, timeout: timeoutMs, maxBuffer: 64 * 1024 * 1024 }, (error, stdout, stderr) =>
      resume(error === null ? Effect.succeed(stdout) : Effect.fail(new CommandFailed({ command: command.join(" "), output: `${stdout}${stderr}`.slice(-4_000) }))))
    return Effect.sync(() => child.kill())
  })

const get = (url: string) =>
  Effect.tryPromise(async () => {
    const res = await fetch(url, { signal: AbortSignal.timeout(2_000) })
    return { status: res.status, body: await res.text() }
  })

/** Polls until the edge answers /readyz with 200: containers start in any order and retry NATS. */
const ready = (base: string) =>
  get(`${base}/readyz`).pipe(
    Effect.filterOrFail((r) => r.status === 200, (r) => new Error(`${base}/readyz answered ${r.status}`)),
    Effect.retry({ schedule: Schedule.spaced("250 millis"), times: 240 })
  )

describe.skipIf(compose === undefined)(`deploy/compose.yaml with ${(compose ?? []).join(" ")}`, () => {
  it.scopedLive("builds the image, gets both edges ready, and carries sessions to the services with a token from the image", () =>
    Effect.gen(function*() {
      const command = compose ?? []
      const [dockerHost, natsImage, nodeImage] = yield* Effect.promise(() => Promise.all([ensureDocker(), ensureNatsImage(), ensureNodeImage()]))
      const [portA, portB] = [yield* freePort, yield* freePort]
      const image = `switchboard/compose-test:${process.pid}`
      const env: NodeJS.ProcessEnv = {
        ...process.env,
        DOCKER_HOST: dockerHost,
        // The classic builder: BuildKit would want to pull its frontend, and the Dockerfile is written for both.
        DOCKER_BUILDKIT: "0",
        COMPOSE_DOCKER_CLI_BUILD: "0",
        SWITCHBOARD_IMAGE: image,
        SWITCHBOARD_NODE_IMAGE: nodeImage,
        SWITCHBOARD_NATS_IMAGE: natsImage,
        SWITCHBOARD_BUNDLES: "prebuilt",
        SWITCHBOARD_JWT_SECRET: SECRET,
        SWITCHBOARD_EDGE_A_PORT: String(portA),
        SWITCHBOARD_EDGE_B_PORT: String(portB),
        TURBO_TELEMETRY_DISABLED: "1",
        DO_NOT_TRACK: "1"
      }
      const project = ["-p", `sbcompose${process.pid}`, "-f", composeFile]
      const docker = (...args: ReadonlyArray<string>) => run(["docker", ...args], env)

      // BUNDLES=prebuilt takes the bundles from the working tree (turbo: cached when unchanged).
      yield* run([`${root}node_modules/.bin/turbo`, "run", "build", "--filter=./services/*", "--filter=@switchboard/postmessage", "--output-logs=errors-only"], env)

      // The classic builder leaves the build stage untagged; remove this build's when done.
      const buildStages = docker("images", "-q", "--filter", "label=org.switchboard.stage=build").pipe(Effect.map((out) => new Set(out.split("\n").filter((id) => id !== ""))))
      const before = yield* buildStages
      const started = Date.now()
      // Registered first, so a build or an up that fails half-way leaves nothing behind either.
      yield* Effect.addFinalizer(() =>
        Effect.gen(function*() {
          yield* run([...command, ...project, "down", "-v", "--remove-orphans"], env)
          const ours = [...(yield* buildStages)].filter((id) => !before.has(id))
          yield* docker("image", "rm", image, ...ours)
        }).pipe(Effect.ignoreLogged))
      // v1's build keeps the container of a failed step unless told not to.
      const forceRm = command[0] === "docker-compose" ? ["--force-rm"] : []
      yield* run([...command, ...project, "build", ...forceRm], env)
      yield* run([...command, ...project, "up", "-d"], env)
      const upTook = Date.now() - started

      const edges = [`http://127.0.0.1:${portA}`, `http://127.0.0.1:${portB}`]
      yield* Effect.all(edges.map(ready), { concurrency: "unbounded" }).pipe(
        Effect.catchAll((e) =>
          run([...command, ...project, "logs", "--tail", "30"], env).pipe(
            Effect.orElseSucceed(() => "(no logs)"),
            Effect.flatMap((logs) => Effect.die(new Error(`the edges never got ready: ${e.message}\n${logs}`)))
          ))
      )
      const readyTook = Date.now() - started

      // The image's own token command, as the README tells an operator to mint a development token.
      const minted = yield* docker("run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL", "-e", "SWITCHBOARD_JWT_SECRET", image, "token", "--sub", "alice")
      const accessToken = minted.trim()
      expect(accessToken).toMatch(/^[\w-]+\.[\w-]+\.[\w-]+$/)

      // Edge A → router → auth: the proxy protocol's handshake and a request.
      const [wsA, wsB] = edges.map((e) => e.replace(/^http/, "ws"))
      const alice = yield* connect(`${wsA}/mcp`)
      alice.send({ jsonrpc: "2.0", id: 1, method: "mcp_handshake", params: { accessToken } })
      expect(yield* alice.next).toMatchObject({ id: 1, result: { authenticated: true, user_id: "alice" } })
      alice.send({ jsonrpc: "2.0", id: 2, method: "list_extensions" })
      expect(yield* alice.next).toEqual({ jsonrpc: "2.0", id: 2, result: { extensions: [] } })

      // Edge B → registry: an MCP session's initialize over the /hub WebSocket.
      const hub = yield* connect(`${wsB}/hub`, { protocols: ["mcp"], headers: { authorization: `Bearer ${accessToken}` } })
      hub.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "compose.test", version: "0" } } })
      expect(yield* hub.next).toMatchObject({ id: 1, result: { protocolVersion: "2025-06-18" } })

      // A wrong token is refused: the edges verify through auth, not merely accept.
      const mallory = yield* connect(`${wsA}/mcp`)
      mallory.send({ jsonrpc: "2.0", id: 1, method: "mcp_handshake", params: { accessToken: `${accessToken}x` } })
      expect(yield* mallory.next).toMatchObject({ id: 1, error: { code: -32000 } })

      yield* Effect.logInfo(`compose (${command.join(" ")}): build and up took ${upTook} ms, both edges ready after ${readyTook} ms`)
    }), 300_000)
})
