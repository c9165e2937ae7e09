/**
 * The servers a benchmark measures, each run as its own process so that the load generator does
 * not share its event loop: `node --import tsx servers.ts <kind>` prints `READY <port>`.
 *
 * - plain:  a `ws` echo server, the baseline.
 * - relay:  a hand-written ws → NATS → echo → NATS → ws relay, what a minimal bus hop costs.
 * - edge:   Switchboard's edge and the echo actor, on the embedded bus or on NATS_URL.
 */
import { NodeRuntime } from "@effect/platform-node"
import { connect } from "@nats-io/transport-node"
import { AuthClient, AuthService, Tokens } from "@switchboard/auth"
import { BusConfig } from "@switchboard/bus"
import { Edge } from "@switchboard/edge"
import { Telemetry } from "@switchboard/telemetry"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import { WebSocketServer } from "ws"
import * as Echo from "../src/support/Echo.ts"

const ready = (port: number) => process.stdout.write(`READY ${port}\n`)
const wsOptions = { port: 0, host: "127.0.0.1", perMessageDeflate: false, maxPayload: 1024 * 1024 } as const

const plain = () => {
  const wss = new WebSocketServer(wsOptions)
  wss.on("connection", (ws) => ws.on("message", (data: Buffer) => ws.send(data, { binary: false })))
  wss.on("listening", () => ready((wss.address() as { port: number }).port))
}

const relay = async () => {
  const nc = await connect({ servers: (process.env["NATS_URL"] ?? "").split(",") })
  const sockets = new Map<string, import("ws").WebSocket>()
  nc.subscribe("relay.in.*", { callback: (_e, m) => nc.publish(`relay.out.${m.subject.slice(9)}`, m.data) })
  nc.subscribe("relay.out.*", { callback: (_e, m) => sockets.get(m.subject.slice(10))?.send(m.data, { binary: false }) })
  let next = 0
  const wss = new WebSocketServer(wsOptions)
  wss.on("connection", (ws) => {
    const id = String(next++)
    sockets.set(id, ws)
    ws.on("message", (data: Buffer) => nc.publish(`relay.in.${id}`, data))
    ws.on("close", () => sockets.delete(id))
  })
  wss.on("listening", () => ready((wss.address() as { port: number }).port))
}

const edge = () =>
  Layer.scopedDiscard(
    Effect.flatMap(Edge.EdgeServer, (server) => Effect.sync(() => ready(server.port)))
  ).pipe(
    Layer.provide(Edge.layer({ routes: Echo.routes })),
    Layer.provide(Echo.layer),
    Layer.provide(AuthClient.layer),
    Layer.provide(AuthService.layer),
    Layer.provide(Tokens.layer),
    Layer.provide(BusConfig.layer("switchboard-bench")),
    Layer.provide(Telemetry.layer("switchboard-bench")),
    Layer.provide(Logger.minimumLogLevel(LogLevel.Warning)),
    Layer.launch,
    NodeRuntime.runMain
  )

const kind = process.argv[2]
if (kind === "plain") plain()
else if (kind === "relay") await relay()
else if (kind === "edge") edge()
else {
  process.stderr.write(`unknown server kind ${kind}; use plain, relay or edge\n`)
  process.exit(2)
}
