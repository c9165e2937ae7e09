/**
 * The servers a benchmark measures, each run as its own process so that the load generator does
 * not share its event loop: `servers.ts <kind>`, bundled like the services (processes.ts), prints
 * `READY <port>`.
 *
 * - plain:  a `ws` echo server, the baseline.
 * - plain-http: a `node:http` echo server (keep-alive, each POST's body back as JSON), the floor
 *   of any request/response protocol on HTTP/1.1 here.
 * - relay:  a hand-written ws → NATS → echo → NATS → ws relay, what a minimal bus hop costs.
 * - edge:   Switchboard's edge and the echo actor, on the embedded bus or on NATS_URL.
 * - naive-relay: the MCP proxy's id mapping by hand in one process, what the embedded proxy
 *   would cost without actors, a bus, auth or limits.
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
import * as Http from "node:http"
import * as LogLevel from "effect/LogLevel"
import { type WebSocket, WebSocketServer } from "ws"
import * as Echo from "../src/support/Echo.ts"
import { answer, isId, parseRecord } from "./frames.ts"

const ready = (port: number) => process.stdout.write(`READY ${port}\n`)
const wsOptions = { port: 0, host: "127.0.0.1", perMessageDeflate: false, maxPayload: 1024 * 1024 } as const

const plain = () => {
  const wss = new WebSocketServer(wsOptions)
  wss.on("connection", (ws) => ws.on("message", (data: Buffer) => ws.send(data, { binary: false })))
  wss.on("listening", () => ready((wss.address() as { port: number }).port))
}

const plainHttp = () => {
  const server = Http.createServer((req, res) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => {
      const body = Buffer.concat(chunks)
      res.writeHead(200, { "content-type": "application/json", "content-length": body.byteLength }).end(body)
    })
  })
  server.keepAliveTimeout = 60_000
  server.listen(0, "127.0.0.1", () => ready((server.address() as { port: number }).port))
}

const relay = async () => {
  const nc = await connect({ servers: (process.env["NATS_URL"] ?? "").split(",") })
  const sockets = new Map<string, WebSocket>()
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


/**
 * One extension (the last to connect to `/extension`) and any number of clients on `/mcp`. A
 * client's request goes to the extension with its id rewritten to `c<client>:<id>`, remembered in
 * the client's pending map as the proxy does; the answer gets its original id back. The protocol's
 * control methods get just enough of an answer for the benchmark's clients: every token is good.
 */
const naiveRelay = () => {
  let extension: WebSocket | undefined
  const clients: Array<{ readonly ws: WebSocket; readonly pending: Map<string, string | number> } | undefined> = []

  const onExtension = (ws: WebSocket) => {
    ws.send(JSON.stringify({ jsonrpc: "2.0", id: "proxy:1", method: "authenticate", params: {} }))
    ws.on("message", (data: Buffer) => {
      const message = parseRecord(data)
      const id = message?.["id"]
      if (message === undefined || typeof id !== "string") return
      if (id === "proxy:1") {
        extension = ws
        return ws.send(JSON.stringify({ jsonrpc: "2.0", method: "authenticated", params: { user_id: "bench", extension_id: "naive" } }))
      }
      const client = clients[Number(id.slice(1, id.indexOf(":")))]
      const original = client?.pending.get(id)
      if (client === undefined || original === undefined) return
      client.pending.delete(id)
      message["id"] = original
      client.ws.send(JSON.stringify(message))
    })
    ws.on("close", () => {
      if (extension === ws) extension = undefined
    })
  }

  const onClient = (ws: WebSocket) => {
    const index = clients.length
    const client = { ws, pending: new Map<string, string | number>() }
    clients.push(client)
    ws.on("message", (data: Buffer) => {
      const message = parseRecord(data)
      const id = message?.["id"]
      if (message === undefined || !isId(id)) return
      const method = message["method"]
      if (method === "mcp_handshake" || method === "list_extensions" || method === "connect") {
        return ws.send(answer(id, method === "list_extensions" ? { extensions: [{ id: "naive", name: "naive", connected: true }] } : {}))
      }
      if (extension === undefined) return ws.send(JSON.stringify({ jsonrpc: "2.0", id, error: { code: -32000, message: "Not connected to an extension" } }))
      const mapped = `c${index}:${id}`
      client.pending.set(mapped, id)
      message["id"] = mapped
      extension.send(JSON.stringify(message))
    })
    ws.on("close", () => (clients[index] = undefined))
  }

  const wss = new WebSocketServer(wsOptions)
  wss.on("connection", (ws, req) => (req.url === "/extension" ? onExtension(ws) : onClient(ws)))
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
else if (kind === "plain-http") plainHttp()
else if (kind === "relay") await relay()
else if (kind === "edge") edge()
else if (kind === "naive-relay") naiveRelay()
else {
  process.stderr.write(`unknown server kind ${kind}; use plain, plain-http, relay, edge or naive-relay\n`)
  process.exit(2)
}
