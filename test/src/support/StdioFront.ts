/**
 * A loopback Streamable HTTP front for `switchboard-mcp`, the stdio bridge, so that peers that only
 * speak HTTP (the MCP conformance suite) can test it. Each session the front opens is one bridge
 * process, spawned as a host would spawn it; the front is the SDK's own unmodified
 * `StreamableHTTPServerTransport`, which relays every JSON-RPC message as it is: a message the peer
 * POSTs becomes a line on the bridge's stdin, and each line the bridge writes goes back on the
 * stream the transport routes it to (a response to its request's POST, anything else to the GET
 * stream). The front answers nothing itself, so what the peer sees of MCP is the bridge's.
 */
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js"
import { JSONRPCMessageSchema } from "@modelcontextprotocol/sdk/types.js"
import * as Effect from "effect/Effect"
import { build } from "esbuild"
import { type ChildProcess, spawn } from "node:child_process"
import { rmSync } from "node:fs"
import { randomUUID } from "node:crypto"
import * as Http from "node:http"
import type * as Net from "node:net"
import { createInterface } from "node:readline"
import { fileURLToPath } from "node:url"

const main = fileURLToPath(new URL("../../../clients/cli/src/main.ts", import.meta.url))

/**
 * The bridge bundled once per test process, as a release would ship it: a session is a bridge
 * process, and under tsx each one spent about 3 s of CPU compiling before it spoke (34 of them
 * were two minutes of a loaded machine); bundled, one starts in a fraction of that.
 */
let bundled: Promise<string> | undefined
const bundle = () =>
  (bundled ??= (async () => {
    // Beside the sources, one directory down, as the bridge finds its package.json (`../package.json`).
    const outfile = fileURLToPath(new URL(`../../../clients/cli/.tmp/switchboard-mcp-${process.pid}.mjs`, import.meta.url))
    process.once("exit", () => rmSync(outfile, { force: true }))
    await build({
      entryPoints: [main],
      bundle: true,
      platform: "node",
      format: "esm",
      target: "node20",
      outfile,
      logLevel: "error",
      // Packages written as CommonJS call require; an ESM bundle has none of its own.
      banner: { js: "import { createRequire as __createRequire } from 'node:module'; const require = __createRequire(import.meta.url);" }
    })
    return outfile
  })())

/**
 * Bridges left running at once: a peer that opens a session per scenario and never DELETEs it
 * would otherwise leave one Node process per scenario. The oldest is stopped past this.
 */
const MAX_BRIDGES = 4

interface Bridge {
  readonly transport: StreamableHTTPServerTransport
  readonly child: ChildProcess
}

export interface StdioFront {
  /** `http://127.0.0.1:<port>/mcp` */
  readonly url: string
  /** Bridges spawned so far. */
  readonly spawned: () => number
  /** What the bridges wrote to stderr, for a failure message. */
  readonly stderr: () => string
}

/** The front, serving bridges started with `args` (`--url`, `--token`, ...); they end with the scope. */
export const stdioFront = (args: ReadonlyArray<string>) =>
  Effect.acquireRelease(
    Effect.async<{ readonly server: Http.Server; readonly children: Set<ChildProcess>; readonly front: StdioFront }>((resume) => {
      const bridges = new Map<string, Bridge>()
      const children = new Set<ChildProcess>()
      let spawned = 0
      let stderr = ""

      const stop = (bridge: Bridge) => {
        bridge.child.kill("SIGTERM")
        void bridge.transport.close().catch(() => {})
      }

      /** A bridge process and the transport that relays to it; registered once initialize gave it a session id. */
      const open = async () => {
        const child = spawn(process.execPath, [await bundle(), ...args], { stdio: ["pipe", "pipe", "pipe"] })
        spawned++
        children.add(child)
        child.once("exit", () => children.delete(child))
        child.stderr?.on("data", (chunk: Buffer) => void (stderr = `${stderr}${chunk.toString()}`.slice(-32_768)))
        child.stdin?.on("error", () => {})
        const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
          sessionIdGenerator: randomUUID,
          onsessioninitialized: (id) => {
            bridges.set(id, { transport, child })
            child.once("exit", () => bridges.delete(id))
            while (bridges.size > MAX_BRIDGES) {
              const [oldest, bridge] = bridges.entries().next().value as [string, Bridge]
              bridges.delete(oldest)
              stop(bridge)
            }
          }
        })
        transport.onmessage = (message) => void child.stdin?.write(`${JSON.stringify(message)}\n`)
        createInterface({ input: child.stdout! }).on("line", (line) => {
          // The bridge writes nothing but MCP to stdout; anything else fails the peer's request by timing out.
          let parsed: ReturnType<typeof JSONRPCMessageSchema.safeParse>
          try {
            parsed = JSONRPCMessageSchema.safeParse(JSON.parse(line))
          } catch {
            return
          }
          if (parsed.success) void transport.send(parsed.data).catch(() => {})
        })
        child.once("exit", () => void transport.close().catch(() => {}))
        await transport.start()
        return { transport, child }
      }

      // One bridge waits, started and connected, for the next initialize: a host starts its
      // server long before it is used, and a peer that opens a session per scenario would
      // otherwise wait for a process start on each.
      let spare = open()
      const take = () => {
        const next = spare
        spare = open()
        return next
      }

      const server = Http.createServer((req, res) => {
        const session = req.headers["mcp-session-id"]
        const known = typeof session === "string" ? bridges.get(session) : undefined
        if (known !== undefined) {
          return void known.transport.handleRequest(req, res).catch((e: unknown) => {
            if (!res.headersSent) res.writeHead(500).end(String(e))
          })
        }
        // Not a known session: only an initialize (a POST without a session id) starts one, on the
        // spare bridge; the rest is refused as the SDK's transport refuses it (400 without an
        // id, 404 for one it does not know), without a process for each.
        const chunks: Array<Buffer> = []
        req.on("data", (chunk: Buffer) => void chunks.push(chunk))
        req.on("end", () => {
          let body: unknown
          try {
            body = JSON.parse(Buffer.concat(chunks).toString("utf8"))
          } catch {
            body = undefined
          }
          const initialize = req.method === "POST" && session === undefined && typeof body === "object" && body !== null && "method" in body && body.method === "initialize"
          if (!initialize) {
            const status = session === undefined ? 400 : 404
            const message = session === undefined ? "Bad Request: Mcp-Session-Id header is required" : "Session not found"
            return void res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32000, message } }))
          }
          take().then(async (fresh) => {
            await fresh.transport.handleRequest(req, res, body)
            if (fresh.transport.sessionId === undefined) stop(fresh)
          }).catch((e: unknown) => {
            if (!res.headersSent) res.writeHead(500).end(String(e))
          })
        })
      })
      server.listen(0, "127.0.0.1", () =>
        resume(Effect.succeed({
          server,
          children,
          front: {
            url: `http://127.0.0.1:${(server.address() as Net.AddressInfo).port}/mcp`,
            spawned: () => spawned,
            stderr: () => stderr
          }
        })))
    }),
    ({ children, server }) =>
      Effect.async<void>((resume) => {
        for (const child of children) child.kill("SIGTERM")
        server.close(() => resume(Effect.void))
        server.closeAllConnections()
      })
  ).pipe(Effect.map(({ front }) => front))
