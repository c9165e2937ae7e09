/**
 * switchboard-mcp across both MCP eras (issue 28 item 6): a legacy host (SDK v1, `initialize`) and a
 * modern host (SDK v2 pinned to 2026-07-28, `server/discover` and a `_meta` envelope on every
 * request) each drive the bridge over stdio, and the bridge speaks 2026-07-28 to `/hub` (Streamable
 * HTTP, no session), so a Switchboard restart between two calls costs the host nothing.
 */
import { Client as ModernClient } from "@modelcontextprotocol/client"
import { StdioClientTransport as ModernStdioTransport } from "@modelcontextprotocol/client/stdio"
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js"
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js"
import { type CallToolResult, ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js"
import { describe, expect, it } from "@effect/vitest"
import { Edge } from "@switchboard/edge"
import { Registry } from "@switchboard/registry"
import { Router } from "@switchboard/router"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Queue from "effect/Queue"
import * as Scope from "effect/Scope"
import { spawn } from "node:child_process"
import { createServer, type Server } from "node:http"
import { type AddressInfo, connect } from "node:net"
import { createInterface } from "node:readline"
import { fileURLToPath } from "node:url"
import type { TestClient } from "./support/Client.ts"
import { freePort } from "./support/FreePort.ts"
import { extensionOf, type Message } from "./support/ProxyPeers.ts"
import { busLayer, stack, token } from "./support/Stack.ts"
import { page, progressPage, tab, textOf } from "./support/Tabs.ts"

const root = fileURLToPath(new URL("../../", import.meta.url))
const bin = `${root}clients/cli/bin/switchboard-mcp.js`
const V = "2026-07-28"
/** A token signed, but not by this Switchboard's key: the edge refuses it with 401. */
const BAD = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl"
/** The bridge's own line naming the era it speaks to /hub. */
const MODERN_HUB = /hub: MCP 2026-07-28 \(Streamable HTTP, no session\) at http:\/\/127\.0\.0\.1:\d+\/hub/

/** Switchboard on `port` in a scope of its own, so a test can stop it and start another on the same port. */
const switchboard = (port: number) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    const ctx = yield* Layer.buildWithScope(stack(busLayer(), { services: Layer.mergeAll(Router.layer, Registry.layer), env: { PORT: String(port) } }), scope)
    const { url } = Context.get(ctx, Edge.EdgeServer)
    yield* Effect.addFinalizer(() => Scope.close(scope, Exit.void))
    return { url, ws: url.replace("http", "ws"), scope, stop: Scope.close(scope, Exit.void) }
  })

/** A tools/call result as either SDK gives it. */
interface ToolResult {
  readonly content: ReadonlyArray<unknown>
  readonly isError?: boolean | undefined
  readonly _meta?: Record<string, unknown> | undefined
}

/**
 * A Switchboard of before 2026-07-28 in front of `edge`: a POST to /hub is answered as the SDK v1's
 * stateful Streamable HTTP server answers a request with no session (400, -32000), and WebSocket
 * upgrades are piped to the real edge. Records each POST's Mcp-Method.
 */
const legacyFront = (edge: URL) =>
  Effect.acquireRelease(
    Effect.async<{ url: string; server: Server; posts: () => ReadonlyArray<string> }>((resume) => {
      const posts: Array<string> = []
      const server = createServer((req, res) => {
        req.resume()
        posts.push(String(req.headers["mcp-method"]))
        res.writeHead(400, { "content-type": "application/json" })
        res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message: "Bad Request: Server not initialized" }, id: null }))
      })
      server.on("upgrade", (req, socket, head) => {
        const upstream = connect(Number(edge.port), edge.hostname, () => {
          const lines = [`${req.method ?? "GET"} ${req.url ?? "/"} HTTP/1.1`]
          for (let i = 0; i + 1 < req.rawHeaders.length; i += 2) lines.push(`${req.rawHeaders[i]}: ${req.rawHeaders[i + 1]}`)
          upstream.write(`${lines.join("\r\n")}\r\n\r\n`)
          upstream.write(head)
          socket.pipe(upstream).pipe(socket)
        })
        upstream.on("error", () => socket.destroy())
        socket.on("error", () => upstream.destroy())
      })
      server.listen(0, "127.0.0.1", () => {
        const { port } = server.address() as AddressInfo
        resume(Effect.succeed({ url: `http://127.0.0.1:${port}`, server, posts: () => posts }))
      })
    }),
    ({ server }) => Effect.async<void>((resume) => {
      server.closeAllConnections()
      server.close(() => resume(Effect.void))
    })
  )

/** What a test needs of a host, whichever SDK it is. */
interface Host {
  readonly era: "legacy" | "modern"
  readonly names: () => Promise<ReadonlyArray<string>>
  readonly call: (name: string, args: Record<string, unknown>, onprogress?: (progress: number) => void) => Promise<ToolResult>
  /** Every notifications/tools/list_changed the host received. */
  readonly changes: Queue.Queue<number>
  readonly stderr: () => string
}

const args = (url: string, jwt: string, extra: ReadonlyArray<string>) => [bin, "--url", url, "--token", jwt, ...extra]

/** An MCP host of the 2025 era: SDK v1's client, `initialize` first. */
const legacyHost = (url: string, jwt: string, extra: ReadonlyArray<string> = []) =>
  Effect.gen(function*() {
    const transport = new StdioClientTransport({ command: process.execPath, args: args(url, jwt, extra), stderr: "pipe", cwd: root })
    const lines: Array<string> = []
    transport.stderr?.on("data", (chunk: Buffer) => void lines.push(chunk.toString()))
    const client = new Client({ name: "legacy-host", version: "0.0.0" })
    const changes = yield* Queue.unbounded<number>()
    client.setNotificationHandler(ToolListChangedNotificationSchema, () => void Queue.unsafeOffer(changes, Date.now()))
    yield* Effect.addFinalizer(() => Effect.promise(() => client.close().catch(() => {})))
    const connected = yield* Effect.either(Effect.tryPromise(() => client.connect(transport)))
    const host: Host = {
      era: "legacy",
      names: () => client.listTools().then(({ tools }) => tools.map((t) => t.name)),
      call: (name, a, onprogress) =>
        client.callTool({ name, arguments: a }, undefined, onprogress === undefined ? {} : { onprogress: (p) => onprogress(p.progress) }) as Promise<CallToolResult>,
      changes,
      stderr: () => lines.join("")
    }
    return { host, connected }
  })

/**
 * An MCP host of the 2026-07-28 era: SDK v2's client, `server/discover` first, pinned to 2026-07-28
 * (no fallback) or, as a dual-era host, `auto` (falls back to `initialize` when discover fails).
 */
const modernHost = (url: string, jwt: string, extra: ReadonlyArray<string> = [], mode: "pin" | "auto" = "pin") =>
  Effect.gen(function*() {
    const transport = new ModernStdioTransport({ command: process.execPath, args: args(url, jwt, extra), stderr: "pipe", cwd: root })
    const lines: Array<string> = []
    transport.stderr?.on("data", (chunk: Buffer) => void lines.push(chunk.toString()))
    const client = new ModernClient({ name: "modern-host", version: "0.0.0" }, { versionNegotiation: { mode: mode === "pin" ? { pin: V } : "auto" } })
    const changes = yield* Queue.unbounded<number>()
    client.setNotificationHandler("notifications/tools/list_changed", () => void Queue.unsafeOffer(changes, Date.now()))
    yield* Effect.addFinalizer(() => Effect.promise(() => client.close().catch(() => {})))
    // Change notifications reach a modern host only on a subscriptions/listen stream it opens.
    const connected = yield* Effect.either(Effect.tryPromise(() => client.connect(transport).then(() => client.listen({ toolsListChanged: true }))))
    const host: Host = {
      era: "modern",
      names: () => client.listTools(undefined, { cacheMode: "bypass" }).then(({ tools }) => tools.map((t) => t.name)),
      call: (name, a, onprogress) => client.callTool({ name, arguments: a }, onprogress === undefined ? {} : { onprogress: (p) => onprogress(p.progress) }),
      changes,
      stderr: () => lines.join("")
    }
    return { host, connected, client }
  })

/** Polls the host's tools/list until `ok` holds. */
const namesUntil = (host: Host, ok: (names: ReadonlyArray<string>) => boolean) =>
  Effect.gen(function*() {
    const started = Date.now()
    for (;;) {
      const names = yield* Effect.promise(() => host.names())
      if (ok(names)) return names
      if (Date.now() - started > 10_000) return yield* Effect.dieMessage(`tools/list never matched; last: ${JSON.stringify(names)}`)
      yield* Effect.sleep("20 millis")
    }
  })

/** Prints the bridge's stderr when the test fails, since that is where the bridge says why. */
const explained = <A, E, R>(stderr: () => string, effect: Effect.Effect<A, E, R>) =>
  Effect.onExit(effect, (exit) => (Exit.isFailure(exit) ? Effect.sync(() => console.error(`--- switchboard-mcp stderr ---\n${stderr()}`)) : Effect.void))

/** A fake extension that opens tab 42 on `createTab`. */
const answering = (ext: TestClient, requests: Array<Message>) =>
  Effect.gen(function*() {
    const m = JSON.parse(yield* Queue.take(ext.messages)) as Message
    if (m.id === undefined) return
    requests.push(m)
    if (m.method === "createTab") ext.send({ jsonrpc: "2.0", id: m.id, result: { tabId: 42, url: m.params?.["url"] } })
    else ext.send({ jsonrpc: "2.0", id: m.id, error: { code: -32000, message: `${String(m.method)} is not supported by this fake` } })
  }).pipe(Effect.forever, Effect.forkScoped)

const refusal = (promise: Promise<unknown>) => Effect.promise(() => promise.then(() => undefined, (e: unknown) => e as { code?: number; message?: string }))

describe("switchboard-mcp in both MCP eras", () => {
  for (const era of ["legacy", "modern"] as const) {
    it.scopedLive(`a ${era} host lists and calls a tab tool with progress, drives the browser, and hears a change of tools; the bridge speaks 2026-07-28 to /hub`, () =>
      Effect.gen(function*() {
        const sb = yield* switchboard(yield* freePort)
        yield* tab(sb.ws, progressPage(), { user: "alice", tabId: 1, url: "https://work.example.com/" })
        const ext = yield* extensionOf(sb.ws, "alice")
        const requests: Array<Message> = []
        yield* answering(ext.c, requests)
        const jwt = yield* token({ sub: "alice" })
        const { connected, host } = era === "legacy" ? yield* legacyHost(sb.url, jwt) : yield* modernHost(sb.url, jwt)
        yield* explained(host.stderr, Effect.gen(function*() {
          expect(connected._tag, host.stderr()).toBe("Right")
          const long = "website_tool_work_example_com_tab1_long"
          yield* namesUntil(host, (n) => n.includes(long) && n.includes("browser_create_tab"))

          const progress: Array<number> = []
          const done = yield* Effect.promise(() => host.call(long, { steps: 2 }, (p) => void progress.push(p)))
          expect(textOf(done)).toBe("done 2")
          expect(progress).toEqual([1, 2])

          const opened = yield* Effect.promise(() => host.call("browser_create_tab", { url: "https://example.com/" }))
          expect(opened.isError).toBeFalsy()
          expect(JSON.parse(textOf(opened) ?? "")).toEqual({ tabId: 42, url: "https://example.com/" })
          expect(requests.map((r) => r.method)).toEqual(["createTab"])

          // An unknown tool is the hub's -32602, with one prefix, in either era.
          const unknown = yield* refusal(host.call("website_tool_nowhere", {}))
          expect(unknown?.code).toBe(-32602)
          // SDK v1 puts one "MCP error -32602: " in front of what the server said; SDK v2 puts none.
          expect(unknown?.message).toMatch(era === "legacy" ? /^MCP error -32602: Unknown tool: website_tool_nowhere;/ : /^Unknown tool: website_tool_nowhere;/)
          expect(unknown?.message).not.toMatch(/MCP error .*MCP error/)

          // A second tab's tool reaches the host as list_changed, then in its list.
          yield* Queue.takeAll(host.changes)
          yield* tab(sb.ws, page("docs", ["search"]), { user: "alice", tabId: 2, url: "https://docs.example.org/" })
          yield* Queue.take(host.changes).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("no list_changed reached the host") }), Effect.orDie)
          yield* namesUntil(host, (n) => n.includes("website_tool_docs_example_org_tab2_search"))

          expect(host.stderr()).toMatch(MODERN_HUB)
          // The edge's side of it: the bridge holds no WebSocket at /hub (the tabs are at /tabs, the browser link at /mcp).
          const metrics = yield* Effect.promise(() => fetch(`${sb.url}/metrics`).then((r) => r.text()))
          expect(metrics).toMatch(/switchboard_edge_connections\{path="\/mcp"\} [1-9]/)
          expect(metrics).not.toMatch(/switchboard_edge_connections\{path="\/hub"\} [1-9]/)
        }))
      }), 60_000)
  }

  it.scopedLive("a modern host's cancellation reaches the page: notifications/cancelled on stdio, an aborted POST to /hub", () =>
    Effect.gen(function*() {
      const sb = yield* switchboard(yield* freePort)
      const aborted = yield* Deferred.make<void>()
      const server = new McpServer({ name: "slow", version: "1.0.0" })
      server.registerTool("work", { description: "reports progress, then waits until cancelled", inputSchema: {} }, async (_args, extra) => {
        await extra.sendNotification({ method: "notifications/progress", params: { progressToken: extra._meta?.progressToken ?? "none", progress: 1, total: 2 } })
        await new Promise<void>((resolve) => extra.signal.addEventListener("abort", () => resolve(), { once: true }))
        Deferred.unsafeDone(aborted, Effect.void)
        return { content: [] }
      })
      yield* tab(sb.ws, server, { user: "alice", tabId: 3, url: "https://slow.example.com/" })
      const { client, connected, host } = yield* modernHost(sb.url, yield* token({ sub: "alice" }), ["--no-browser"])
      yield* explained(host.stderr, Effect.gen(function*() {
        expect(connected._tag, host.stderr()).toBe("Right")
        const work = "website_tool_slow_example_com_tab3_work"
        yield* namesUntil(host, (n) => n.includes(work))
        const progress = yield* Queue.unbounded<number>()
        const cancel = new AbortController()
        const pending = client.callTool({ name: work, arguments: {} }, { signal: cancel.signal, onprogress: (p) => void Queue.unsafeOffer(progress, p.progress) })
        pending.catch(() => {})
        expect(yield* Queue.take(progress)).toBe(1)
        cancel.abort("the user changed their mind")
        yield* Deferred.await(aborted).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("the page never saw the cancellation") }), Effect.orDie)
      }))
    }), 60_000)

  it.scopedLive("a Switchboard restart between two calls loses nothing: the second call works at once, with no connection to lose", () =>
    Effect.gen(function*() {
      const port = yield* freePort
      const first = yield* switchboard(port)
      yield* tab(first.ws, page("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/cart" })
      // A legacy host, which the bridge served before this change too: what differs is the hub's side.
      const { connected, host } = yield* legacyHost(first.url, yield* token({ sub: "alice" }), ["--no-browser"])
      yield* explained(host.stderr, Effect.gen(function*() {
        expect(connected._tag, host.stderr()).toBe("Right")
        const getCart = "website_tool_shop_example_com_tab1_getCart"
        yield* namesUntil(host, (n) => n.includes(getCart))
        expect(textOf(yield* Effect.promise(() => host.call(getCart, { text: "x" })))).toBe("shop:getCart:x")

        yield* first.stop
        const second = yield* switchboard(port)
        yield* tab(second.ws, page("shop-again", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/cart" }).pipe(Scope.extend(second.scope))
        // No retry: the first call after the restart is answered by the new Switchboard.
        const again = yield* Effect.promise(() => host.call(getCart, { text: "y" }))
        expect(again, host.stderr()).toEqual({ content: [{ type: "text", text: "shop-again:getCart:y" }] })
        // The second call went out once, and the hub's serverInfo stayed out of a legacy host's result.
        expect(host.stderr()).toMatch(MODERN_HUB)
        expect(host.stderr()).not.toMatch(/tools\/call .* failed/)
      }))
    }), 60_000)

  it.scopedLive("a Switchboard that answers server/discover as a legacy server keeps the WebSocket session, and a modern host is served all the same", () =>
    Effect.gen(function*() {
      const sb = yield* switchboard(yield* freePort)
      const legacy = yield* legacyFront(new URL(sb.url))
      yield* tab(sb.ws, page("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/cart" })
      const { connected, host } = yield* modernHost(legacy.url, yield* token({ sub: "alice" }), ["--no-browser"])
      yield* explained(host.stderr, Effect.gen(function*() {
        expect(connected._tag, host.stderr()).toBe("Right")
        const getCart = "website_tool_shop_example_com_tab1_getCart"
        yield* namesUntil(host, (n) => n.includes(getCart))
        expect(textOf(yield* Effect.promise(() => host.call(getCart, { text: "x" })))).toBe("shop:getCart:x")
        yield* Queue.takeAll(host.changes)
        yield* tab(sb.ws, page("docs", ["search"]), { user: "alice", tabId: 2, url: "https://docs.example.org/" })
        yield* Queue.take(host.changes).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("no list_changed reached the host") }), Effect.orDie)
        yield* namesUntil(host, (n) => n.includes("website_tool_docs_example_org_tab2_search"))
        // The probes only (SDK v2's stdio client runs a second, short-lived bridge to probe the era
        // itself, so there may be two); everything else went over the WebSocket.
        expect(legacy.posts().length).toBeGreaterThan(0)
        expect(new Set(legacy.posts())).toEqual(new Set(["server/discover"]))
        expect(host.stderr()).toMatch(/hub: server\/discover answered HTTP 400; speaking the legacy era over WebSocket at ws:\/\/127\.0\.0\.1:\d+\/hub/)
        expect(host.stderr()).toMatch(/hub: connected to ws:\/\/127\.0\.0\.1:\d+\/hub/)
        expect(host.stderr()).not.toMatch(MODERN_HUB)
      }))
    }), 60_000)

  it.scopedLive("a refused token fails a modern host's server/discover with the clear message on the wire", () =>
    Effect.gen(function*() {
      const sb = yield* switchboard(yield* freePort)
      // SDK v2 keeps a failed discover's message to itself, so this host is the wire: one line in, one out.
      const child = spawn(process.execPath, args(sb.url, BAD, ["--no-browser"]), { cwd: root, stdio: ["pipe", "pipe", "pipe"] })
      yield* Effect.addFinalizer(() => Effect.sync(() => child.kill()))
      const meta = { "io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientInfo": { name: "raw-host", version: "0" }, "io.modelcontextprotocol/clientCapabilities": {} }
      child.stdin.write(`${JSON.stringify({ jsonrpc: "2.0", id: 1, method: "server/discover", params: { _meta: meta } })}\n`)
      const line = yield* Effect.async<string>((resume) => {
        createInterface({ input: child.stdout }).once("line", (l) => resume(Effect.succeed(l)))
      }).pipe(Effect.timeoutFail({ duration: "20 seconds", onTimeout: () => new Error("the bridge never answered server/discover") }), Effect.orDie)
      expect(JSON.parse(line)).toEqual({
        jsonrpc: "2.0",
        id: 1,
        error: { code: -32603, message: `Switchboard at ${sb.url} refused the token (HTTP 401): check --token or SWITCHBOARD_TOKEN` }
      })
    }), 60_000)

  for (const era of ["legacy", "modern"] as const) {
    it.scopedLive(`a refused token fails a ${era} host's first request with one clear message`, () =>
      Effect.gen(function*() {
        const sb = yield* switchboard(yield* freePort)
        const bad = BAD
        // The modern host is a dual-era one: its discover fails, so it tries initialize, which fails the same way.
        const { connected, host } = era === "legacy" ? yield* legacyHost(sb.url, bad, ["--no-browser"]) : yield* modernHost(sb.url, bad, ["--no-browser"], "auto")
        expect(connected._tag, host.stderr()).toBe("Left")
        const message = String(connected._tag === "Left" ? connected.left.error : "")
        expect(message).toContain(`Switchboard at ${sb.url} refused the token (HTTP 401): check --token or SWITCHBOARD_TOKEN`)
        expect(host.stderr()).toContain("not retrying until restarted with another configuration")
        expect(host.stderr()).not.toMatch(/reconnecting in/)
      }), 60_000)
  }
})
