/**
 * The servers a benchmark measures, each run as its own process so that the load generator does
 * not share its event loop: `servers.ts <kind>`, bundled like the services (processes.ts), prints
 * `READY <port>`.
 *
 * - hub-floor: the least a `/hub` tools/call over HTTP must do, by hand in one process: parse the
 *   POST, one frame to the tab on `/tabs` and its answer back, the JSON response written (issue 28).
 * - relay:  a hand-written ws → NATS → echo → NATS → ws relay, what a minimal bus hop costs.
 * - edge:   Switchboard's edge and the echo actor, on the embedded bus or on NATS_URL.
 * - naive-relay: the MCP proxy's id mapping by hand in one process, what the embedded proxy
 *   would cost without actors, a bus, auth or limits.
 * - nats-relay-edge, nats-relay-router: the same id mapping split as the distributed proxy splits
 *   it, edges and a router as processes of their own on NATS_URL, by hand (no Effect, no KV, no
 *   auth). The floor of the distributed proxy: the same four NATS hops per round trip.
 */
import { NodeRuntime } from "@effect/platform-node"
import { connect, type Msg, type NatsConnection } from "@nats-io/transport-node"
import { AuthClient, AuthService, Tokens } from "@switchboard/auth"
import { BusConfig } from "@switchboard/bus"
import { corker, FrozenHeaders, installPooledEncoder, rawHeaderBlock } from "@switchboard/bus/internal/NatsShims"
import { Edge } from "@switchboard/edge"
import { Telemetry } from "@switchboard/telemetry"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as Http from "node:http"
import * as LogLevel from "effect/LogLevel"
import { type WebSocket, WebSocketServer } from "ws"
import * as Echo from "../src/support/Echo.ts"
import { answer, batchedSender, isId, isRecord, parseRecord } from "./frames.ts"
import { ready, wsOptions } from "./listen.ts"

/**
 * A tools/call over Streamable HTTP at its least: the POST's JSON parsed, `browser/executeTool` to
 * the tab (the last socket on any path; the bench's tab) under an id of its own, the tab's answer
 * parsed and its payload written back as the call's result. No auth, checks, bus or timers: the bus
 * hop of the all-in-one is a function call, so this is the floor under the modern hub's CPU.
 * Deliveries to the tab are corked over a turn, as the edge writes them.
 */
const hubFloor = () => {
  let tab: ((data: string) => void) | undefined
  const waiting = new Map<number, { readonly res: Http.ServerResponse; readonly id: string | number }>()
  let next = 0
  const respond = (res: Http.ServerResponse, status: number, body: string) =>
    res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) }).end(body)
  const server = Http.createServer((req, res) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => {
      const message = parseRecord(Buffer.concat(chunks))
      const id = message?.["id"]
      const params = message?.["params"]
      if (!isId(id) || !isRecord(params)) return respond(res, 400, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"not a request"}}`)
      if (tab === undefined) return respond(res, 503, `{"jsonrpc":"2.0","id":${JSON.stringify(id)},"error":{"code":-32000,"message":"no tab"}}`)
      const n = next++
      waiting.set(n, { res, id })
      tab(JSON.stringify({ jsonrpc: "2.0", id: n, method: "browser/executeTool", params: { toolName: params["name"], args: params["arguments"] } }))
    })
  })
  server.keepAliveTimeout = 60_000
  const wss = new WebSocketServer({ server, perMessageDeflate: false, maxPayload: wsOptions.maxPayload })
  wss.on("connection", (ws) => {
    tab = batchedSender(ws)
    ws.on("message", (data: Buffer) => {
      const message = parseRecord(data)
      const n = message?.["id"]
      if (typeof n !== "number") return // hello, registerTools
      const call = waiting.get(n)
      if (call === undefined) return
      waiting.delete(n)
      const result = message?.["result"]
      respond(call.res, 200, answer(call.id, isRecord(result) ? result["payload"] : result))
    })
  })
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
 * The relay's wire, shaped as the distributed proxy's (sb.router.conn.<conn> in, sb.edge.<edge>.out
 * back, headers for the envelope) so that each frame pays for the same hops and headers, and
 * nothing else: an edge's frames go to the router, the router's to the edge that holds the socket.
 */
const RelayWire = {
  toRouter: (edge: string, conn: string) => `relay.router.${edge}.${conn}`,
  routerAll: "relay.router.>",
  toEdge: (edge: string) => `relay.edge.${edge}.out`,
  conn: "sb-conn",
  op: "sb-op"
} as const

/**
 * A NATS connection with the bus's own nats.js shims (libs/bus NatsShims: pooled encoder, headers
 * encoded once, headers read from the raw block, the socket corked over a turn), so that the floor
 * pays per hop what the bus pays and no more. `publish` corks before each publish, as the bus does.
 */
const relayConnection = async () => {
  installPooledEncoder()
  const nc: NatsConnection = await connect({ servers: (process.env["NATS_URL"] ?? "").split(",") })
  const cork = corker(nc)
  const publish = (subject: string, data: Uint8Array | string, headers: FrozenHeaders) => {
    cork()
    nc.publish(subject, data, { headers })
  }
  return { nc, publish }
}

/** Built once per connection and kind, and then only reused: FrozenHeaders makes its wire form once. */
const envelope = (conn: string, op: string) => FrozenHeaders.of({ [RelayWire.conn]: conn, [RelayWire.op]: op })!

/** A header of ours (`name: value`, no line breaks) from the raw block, or from nats.js's parse without it. */
const headerOf = (msg: Msg, name: string): string | undefined => {
  const head = rawHeaderBlock(msg)
  if (head === undefined) return msg.headers?.get(name)
  const at = head.indexOf(`\r\n${name}:`)
  if (at < 0) return undefined
  const from = at + name.length + 3
  return head.slice(from, head.indexOf("\r\n", from)).trim()
}

/**
 * Sockets to NATS and back: an `open` (with the path) and a `closed` around each socket's frames.
 * Deliveries to a socket are corked until the microtask checkpoint, as the edge writes them: the
 * deliveries of one NATS read leave in one write, not a system call each.
 */
const natsRelayEdge = async () => {
  const { nc, publish } = await relayConnection()
  const edgeId = `e${process.pid}`
  const sockets = new Map<string, (data: Uint8Array) => void>()
  nc.subscribe(RelayWire.toEdge(edgeId), {
    callback: (_e, m) => sockets.get(headerOf(m, RelayWire.conn) ?? "")?.(m.data)
  })
  let next = 0
  const wss = new WebSocketServer(wsOptions)
  wss.on("connection", (ws, req) => {
    const conn = String(next++)
    const subject = RelayWire.toRouter(edgeId, conn)
    const frame = envelope(conn, "frame")
    sockets.set(conn, batchedSender(ws))
    publish(subject, req.url ?? "/", envelope(conn, "open"))
    ws.on("message", (data: Buffer) => publish(subject, data, frame))
    ws.on("close", () => {
      sockets.delete(conn)
      publish(subject, "", envelope(conn, "closed"))
    })
  })
  wss.on("listening", () => ready((wss.address() as { port: number }).port))
}

/** Where a frame's `"id":` value starts and ends (the first one: every frame here puts it before `params`). */
const idSpan = (text: string): { readonly start: number; readonly end: number } | undefined => {
  const at = text.indexOf(`"id":`)
  if (at < 0) return undefined
  const start = at + 5
  if (text[start] === `"`) {
    // Ids here hold no escaped quotes: the clients' are numbers, the mapped ones come from JSON.stringify of those.
    const close = text.indexOf(`"`, start + 1)
    return close < 0 ? undefined : { start, end: close + 1 }
  }
  let end = start
  while (end < text.length && text[end] !== "," && text[end] !== "}") end++
  return { start, end }
}

const CONTROL = [`"method":"mcp_handshake"`, `"method":"connect"`, `"method":"list_extensions"`]

/**
 * naive-relay's id mapping on the far side of NATS: it learns each socket's role from its `open`,
 * and addresses a frame to a socket by its edge's subject and a header. Ids are rewritten in the
 * frame's text without parsing it, which no real router can afford (it must validate), so that this
 * stays a floor; the original id's text (number or string) goes back as it came.
 */
const natsRelayRouter = async () => {
  const { nc, publish } = await relayConnection()
  interface Peer {
    readonly edge: string
    readonly conn: string
    readonly deliver: FrozenHeaders
  }
  interface Client extends Peer {
    /** Mapped id → the original id's JSON text. */
    readonly pending: Map<string, string>
  }
  let extension: Peer | undefined
  const clients = new Map<string, Client>()
  const sendTo = (peer: Peer, data: string) => publish(RelayWire.toEdge(peer.edge), data, peer.deliver)
  const fromExtension = (text: string) => {
    const span = idSpan(text)
    if (span === undefined || text[span.start] !== `"`) return
    const mapped = text.slice(span.start + 1, span.end - 1)
    const client = clients.get(mapped.slice(0, mapped.indexOf(":")))
    const original = client?.pending.get(mapped)
    if (client === undefined || original === undefined) return
    client.pending.delete(mapped)
    sendTo(client, text.slice(0, span.start) + original + text.slice(span.end))
  }
  const fromClient = (key: string, client: Client, text: string) => {
    if (CONTROL.some((c) => text.includes(c))) {
      const message = parseRecord(Buffer.from(text))
      const id = message?.["id"]
      if (!isId(id)) return
      const result = message?.["method"] === "list_extensions" ? { extensions: [{ id: "relay", name: "relay", connected: true }] } : {}
      return sendTo(client, answer(id, result))
    }
    const span = idSpan(text)
    if (span === undefined) return
    const original = text.slice(span.start, span.end)
    if (extension === undefined) return sendTo(client, `{"jsonrpc":"2.0","id":${original},"error":{"code":-32000,"message":"Not connected to an extension"}}`)
    const mapped = `${key}:${original}`
    client.pending.set(mapped, original)
    sendTo(extension, text.slice(0, span.start) + JSON.stringify(mapped) + text.slice(span.end))
  }
  nc.subscribe(RelayWire.routerAll, {
    callback: (_e, m) => {
      const edge = m.subject.split(".")[2] ?? ""
      const conn = headerOf(m, RelayWire.conn) ?? ""
      const op = headerOf(m, RelayWire.op)
      // Client keys hold no ':' (the mapped id splits on the first one).
      const key = `c${edge}-${conn}`
      if (op === "open") {
        if (m.string() === "/extension") {
          const peer = { edge, conn, deliver: envelope(conn, "deliver") }
          extension = peer
          sendTo(peer, JSON.stringify({ jsonrpc: "2.0", id: "proxy:1", method: "authenticate", params: {} }))
          return sendTo(peer, JSON.stringify({ jsonrpc: "2.0", method: "authenticated", params: { user_id: "bench", extension_id: "relay" } }))
        }
        return void clients.set(key, { edge, conn, deliver: envelope(conn, "deliver"), pending: new Map() })
      }
      if (op === "closed") {
        if (extension?.edge === edge && extension.conn === conn) extension = undefined
        return void clients.delete(key)
      }
      if (extension?.edge === edge && extension.conn === conn) return fromExtension(m.string())
      const client = clients.get(key)
      if (client !== undefined) fromClient(key, client, m.string())
    }
  })
  // The subscription must reach the server before the bench opens sockets whose `open` it would miss.
  await nc.flush()
  ready(0)
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
if (kind === "hub-floor") hubFloor()
else if (kind === "relay") await relay()
else if (kind === "edge") edge()
else if (kind === "naive-relay") naiveRelay()
else if (kind === "nats-relay-edge") await natsRelayEdge()
else if (kind === "nats-relay-router") await natsRelayRouter()
else {
  process.stderr.write(`unknown server kind ${kind}; use hub-floor, relay, edge, naive-relay, nats-relay-edge or nats-relay-router\n`)
  process.exit(2)
}
