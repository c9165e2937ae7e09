/**
 * What the edge's unit tests share: settings as a deployment passes them, an HTTP server on a
 * free loopback port that hands its requests and upgrades to the part under test, and the
 * integration suite's WebSocket client (messages in a Queue, the close in a Deferred).
 */
import * as ConfigProvider from "effect/ConfigProvider"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import * as Schedule from "effect/Schedule"
import * as Http from "node:http"
import type * as Net from "node:net"
import type { Duplex } from "node:stream"
import * as Client from "../../../test/src/support/Client.ts"
import { UpgradeRefused } from "../../../test/src/support/Client.ts"

export { closedWith, connect, type TestClient, UpgradeRefused } from "../../../test/src/support/Client.ts"

export const SECRET = "test-secret-that-is-long-enough-for-hs256"

/** Settings as environment variables, and only errors in the log. */
export const settings = (env: Readonly<Record<string, string>> = {}) =>
  Layer.merge(
    Layer.setConfigProvider(ConfigProvider.fromMap(new Map(Object.entries({ SWITCHBOARD_JWT_SECRET: SECRET, ...env })))),
    Logger.minimumLogLevel(LogLevel.Error)
  )

export interface Listeners {
  readonly onRequest?: (req: Http.IncomingMessage, res: Http.ServerResponse) => void
  readonly onUpgrade?: (req: Http.IncomingMessage, socket: Duplex, head: Buffer) => void
}

/** An HTTP server on 127.0.0.1 and a free port for as long as the scope lives; its base URLs. */
export const listen = (listeners: Listeners) =>
  Effect.acquireRelease(
    Effect.async<Http.Server>((resume) => {
      const server = Http.createServer(listeners.onRequest ?? ((_req, res) => res.writeHead(404).end()))
      if (listeners.onUpgrade !== undefined) server.on("upgrade", listeners.onUpgrade)
      server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
    }),
    (server) =>
      Effect.async<void>((resume) => {
        server.close(() => resume(Effect.void))
        server.closeAllConnections()
      })
  ).pipe(Effect.map((server) => {
    const address = server.address() as Net.AddressInfo
    const http = `http://127.0.0.1:${address.port}`
    return { port: address.port, http, ws: http.replace("http", "ws") }
  }))

/** The HTTP status and body an upgrade was refused with, or "accepted". */
export const refusal = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.either(effect).pipe(
    Effect.map((r) => (r._tag === "Right" ? "accepted" : r.left instanceof UpgradeRefused ? { status: r.left.status, body: r.left.body } : `failed: ${String(r.left)}`))
  )

/** Writes a raw request and returns the status line's code, for targets no HTTP client sends. */
export const rawStatus = (port: number, request: string) => Client.rawStatus(port, request, "10 seconds")

/** Retries `check` until it succeeds, for at most five seconds: for what the edge learns a moment later (a close). */
export const eventually = <A, E, R>(check: Effect.Effect<A, E, R>) =>
  check.pipe(Effect.retry(Schedule.spaced("20 millis").pipe(Schedule.upTo("5 seconds"))))
