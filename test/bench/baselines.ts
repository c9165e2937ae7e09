/**
 * The baselines, each as small a program as a user would write, in a bundle of its own
 * (`baselines.ts <kind>`, prints `READY <port>`):
 *
 * - plain: a `ws` echo server, what a socket costs without Switchboard.
 * - plain-http: a `node:http` echo server (keep-alive, each POST's body back as JSON), the floor
 *   of any request/response protocol on HTTP/1.1 here.
 *
 * Not in servers.ts: a process's memory depends on what it loaded. Loading that bundle (every
 * bench server, Switchboard's edge among them) left the plain server 14 MB of main malloc heap,
 * much of it free, and its sockets' native memory (0.6 KB each) came from there unseen in some runs
 * and not in others: the same plain server read 5.7 to 6.4 KB a socket in most runs and 6.8 to 6.9
 * in two (issue 29). Here it starts with 3 MB, and pays for its sockets as a server would.
 */
import * as Http from "node:http"
import { WebSocketServer } from "ws"
import { ready, wsOptions } from "./listen.ts"

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

const kind = process.argv[2]
if (kind === "plain") plain()
else if (kind === "plain-http") plainHttp()
else {
  process.stderr.write(`unknown baseline ${kind}; use plain or plain-http\n`)
  process.exit(2)
}
