/**
 * The image an operator deploys (deploy/Dockerfile), built here on a Node base made from this
 * machine's node binary, and run as it should be: non-root, read-only root filesystem, no
 * capabilities, listening on 127.0.0.1 only. It serves, carries a WebSocket session, and stops on
 * SIGTERM with exit code 0, its sockets closed with 1001, well within the grace period.
 */
import { expect, layer } from "@effect/vitest"
import { NatsServer, SwitchboardContainer, SwitchboardImage } from "@switchboard/testing"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import { closedWith, connect, type TestClient } from "./support/Client.ts"
import { namespace, SECRET, token } from "./support/Stack.ts"
import { until } from "./support/Until.ts"

const LISTENING = /edge \S+ listening on/
/** Docker's default for `docker stop`; Kubernetes gives 30 s. */
const GRACE = Duration.seconds(10)

const get = (url: string) =>
  Effect.promise(async () => {
    const res = await fetch(url, { signal: AbortSignal.timeout(5_000) })
    return { status: res.status, body: await res.text() }
  })

const handshake = (c: TestClient, accessToken: string) =>
  Effect.gen(function*() {
    c.send({ jsonrpc: "2.0", id: 1, method: "mcp_handshake", params: { accessToken } })
    return yield* c.next
  })

/**
 * A socket on `/mcp` that has completed `mcp_handshake`: edge → router → auth and back. Fails (so
 * it can be retried) while the services behind the edge do not answer yet.
 */
const session = (wsUrl: string, sub: string) =>
  Effect.gen(function*() {
    const accessToken = yield* token({ sub })
    const c = yield* connect(`${wsUrl}/mcp`)
    const reply = yield* handshake(c, accessToken)
    const { result } = reply as { readonly result?: { readonly authenticated?: boolean; readonly user_id?: string } }
    if (result?.authenticated !== true || result.user_id !== sub) return yield* Effect.fail(new Error(`handshake answered ${JSON.stringify(reply)}`))
    return c
  })

/** Node code run inside the container: who it runs as, what PID 1 is, whether / is writable. */
const probe = [
  "const fs = require('node:fs');",
  "let writable = true; try { fs.writeFileSync('/app/probe', 'x') } catch (e) { writable = e.code }",
  "console.log(JSON.stringify({ uid: process.getuid(), gid: process.getgid(), pid1: fs.readFileSync('/proc/1/cmdline', 'utf8').split('\\0')[0], writable }))"
].join(" ")

layer(SwitchboardImage.layer, { excludeTestServices: true, timeout: "180 seconds" })("the Switchboard image", (it) => {
  it.scoped("runs the all-in-one non-root on a read-only root, serves HTTP and WebSockets, and stops on SIGTERM with 0", () =>
    Effect.gen(function*() {
      const sb = yield* SwitchboardContainer.start({ env: { SWITCHBOARD_JWT_SECRET: SECRET, LOG_LEVEL: "info" }, ready: LISTENING })

      const inside = yield* sb.exec(["node", "-e", probe])
      expect(inside.exitCode).toBe(0)
      expect(JSON.parse(inside.output)).toEqual({ uid: 1000, gid: 1000, pid1: "node", writable: "EROFS" })

      expect(yield* get(`${sb.url}/healthz`)).toMatchObject({ status: 200 })
      // 503 until every service of the all-in-one runs, which may be a moment after it listens.
      const ready = yield* get(`${sb.url}/readyz`).pipe(
        Effect.filterOrFail((r) => r.status === 200, (r) => `readyz answered ${r.status} ${r.body}`),
        Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 200 }),
        Effect.orDie
      )
      expect(ready).toMatchObject({ status: 200, body: "ready\n" })
      const embed = yield* get(`${sb.url}/embed`)
      expect(embed.status).toBe(200)
      expect(embed.body).toContain("<script")

      const ws = sb.url.replace(/^http/, "ws")
      const alice = yield* session(ws, "alice")
      alice.send({ jsonrpc: "2.0", id: 2, method: "list_extensions" })
      expect(yield* alice.next).toEqual({ jsonrpc: "2.0", id: 2, result: { extensions: [] } })

      // node is PID 1: SIGTERM reaches the app's own handler, which closes sockets and exits 0.
      const stopped = yield* sb.stop(GRACE)
      yield* Effect.logInfo(`all-in-one stopped with ${stopped.exitCode} in ${Duration.format(stopped.took)}`)
      expect(stopped.exitCode).toBe(0)
      expect(Duration.lessThan(stopped.took, GRACE)).toBe(true)
      expect((yield* closedWith(alice)).code).toBe(1001)
      // The log stream may deliver the last lines after the exit.
      yield* until(() => /edge \S+ shutting down: closing 1 sockets with 1001/.test(sb.output()), "the edge's shutdown line in the log")
    }), 90_000)

  it.scoped("runs the services one per container on NATS: auth, router and an edge", () =>
    Effect.gen(function*() {
      const { url: natsUrl } = yield* NatsServer
      const env = { NATS_URL: natsUrl, SWITCHBOARD_JWT_SECRET: SECRET, SWITCHBOARD_NAMESPACE: namespace(), LOG_LEVEL: "info" }
      const service = (name: string, ready: RegExp) =>
        SwitchboardContainer.start({ command: ["node", "--enable-source-maps", `services/${name}/dist/main.js`], env, ready })
      const [auth, router, edge] = yield* Effect.all(
        [service("auth", /auth: answering token verification/), service("router", /router: hosting connection actors/), service("edge", LISTENING)],
        { concurrency: "unbounded" }
      )

      const ws = edge.url.replace(/^http/, "ws")
      // The edge may listen before its first request to the router finds an answer: retry the session.
      const bob = yield* session(ws, "bob").pipe(Effect.retry({ schedule: Schedule.spaced("200 millis"), times: 25 }))
      bob.send({ jsonrpc: "2.0", id: 2, method: "list_extensions" })
      expect(yield* bob.next).toEqual({ jsonrpc: "2.0", id: 2, result: { extensions: [] } })

      for (const [name, c] of [["edge", edge], ["router", router], ["auth", auth]] as const) {
        const stopped = yield* c.stop(GRACE)
        yield* Effect.logInfo(`${name} stopped with ${stopped.exitCode} in ${Duration.format(stopped.took)}`)
        expect({ exitCode: stopped.exitCode, inGrace: Duration.lessThan(stopped.took, GRACE) }).toEqual({ exitCode: 0, inGrace: true })
      }
    }).pipe(Effect.provide(NatsServer.layer)), 90_000)
})
