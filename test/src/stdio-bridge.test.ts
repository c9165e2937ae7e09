/**
 * switchboard-mcp, the stdio bridge, as an MCP host runs it: a real child process started by the
 * SDK's `StdioClientTransport`, against an in-process Switchboard (edge, router, registry) with
 * real tabs at `/tabs` and a fake extension at `/extension`. Also its command line, and every
 * host-config snippet in the README.
 */
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
import * as Schedule from "effect/Schedule"
import * as Scope from "effect/Scope"
import { execFile } from "node:child_process"
import { readFileSync } from "node:fs"
import { fileURLToPath } from "node:url"
import type { TestClient } from "./support/Client.ts"
import { freePort } from "./support/FreePort.ts"
import { extensionOf, type Message } from "./support/ProxyPeers.ts"
import { busLayer, stack, token } from "./support/Stack.ts"
import { page, tab, textOf } from "./support/Tabs.ts"
import { until } from "./support/Until.ts"

const root = fileURLToPath(new URL("../../", import.meta.url))
const bin = `${root}clients/cli/bin/switchboard-mcp.js`

/** A 1×1 PNG. */
const PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="

/** Switchboard on `port` in a scope of its own, so the test can stop it and start another on the same port. */
const switchboard = (port: number) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    const ctx = yield* Layer.buildWithScope(stack(busLayer(), { services: Layer.mergeAll(Router.layer, Registry.layer), env: { PORT: String(port) } }), scope)
    const { url } = Context.get(ctx, Edge.EdgeServer)
    yield* Effect.addFinalizer(() => Scope.close(scope, Exit.void))
    return { url, ws: url.replace("http", "ws"), scope, stop: Scope.close(scope, Exit.void) }
  })

/** The MCP host: the SDK's client, with switchboard-mcp as its child process; stderr is kept for failure messages. */
const host = (url: string, user: string) =>
  Effect.acquireRelease(
    Effect.gen(function*() {
      const transport = new StdioClientTransport({
        command: process.execPath,
        args: [bin, "--url", url, "--token", yield* token({ sub: user })],
        stderr: "pipe",
        cwd: root
      })
      const lines: Array<string> = []
      transport.stderr?.on("data", (chunk: Buffer) => void lines.push(chunk.toString()))
      const client = new Client({ name: "test-host", version: "0.0.0" })
      const changes: Array<number> = []
      client.setNotificationHandler(ToolListChangedNotificationSchema, () => void changes.push(Date.now()))
      yield* Effect.promise(() => client.connect(transport))
      return { client, transport, changes, stderr: () => lines.join("") }
    }),
    ({ client }) => Effect.promise(() => client.close())
  )

/** Prints the bridge's stderr when the test fails, since that is where the bridge says why. */
const explained = <A, E, R>(stderr: () => string, effect: Effect.Effect<A, E, R>) =>
  Effect.onExit(effect, (exit) => (Exit.isFailure(exit) ? Effect.sync(() => console.error(`--- switchboard-mcp stderr ---\n${stderr()}`)) : Effect.void))

const call = (client: Client, name: string, args: Record<string, unknown> = {}) =>
  Effect.promise(() => client.callTool({ name, arguments: args }) as Promise<CallToolResult>)

const names = (client: Client) => Effect.promise(() => client.listTools()).pipe(Effect.map(({ tools }) => tools.map((t) => t.name)))

/** A fake extension's answers: `createTab` opens tab 42, `screenshot` is a data URL; every request is recorded. */
const answering = (ext: TestClient, requests: Array<Message>) =>
  Effect.gen(function*() {
    const m = JSON.parse(yield* Queue.take(ext.messages)) as Message
    if (m.id === undefined) return // status keepalives
    requests.push(m)
    if (m.method === "createTab") ext.send({ jsonrpc: "2.0", id: m.id, result: { tabId: 42, url: m.params?.["url"] } })
    else if (m.method === "screenshot") ext.send({ jsonrpc: "2.0", id: m.id, result: { screenshot: `data:image/png;base64,${PNG}` } })
    else ext.send({ jsonrpc: "2.0", id: m.id, error: { code: -32000, message: `${String(m.method)} is not supported by this fake` } })
  }).pipe(Effect.forever, Effect.forkScoped)

/** Runs the bridge's command line to completion. */
const run = (command: string, args: ReadonlyArray<string>, env: Record<string, string> = {}) =>
  Effect.async<{ code: number; stdout: string; stderr: string }>((resume) => {
    execFile(command, [...args], { cwd: root, env: { PATH: process.env["PATH"] ?? "", ...env }, timeout: 20_000 }, (error, stdout, stderr) =>
      resume(Effect.succeed({ code: error === null ? 0 : typeof error.code === "number" ? error.code : -1, stdout, stderr }))
    )
  })

describe("switchboard-mcp (stdio bridge)", () => {
  it.scopedLive(
    "relays hub tools and list_changed, drives the browser, and rides out a Switchboard restart",
    () =>
      Effect.gen(function*() {
        const port = yield* freePort
        const first = yield* switchboard(port)
        yield* tab(first.ws, page("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/cart" })
        const ext = yield* extensionOf(first.ws, "alice")
        const requests: Array<Message> = []
        yield* answering(ext.c, requests)
        const { changes, client, stderr, transport } = yield* host(first.url, "alice")

        yield* explained(
          stderr,
          Effect.gen(function*() {
            const getCart = "website_tool_shop_example_com_tab1_getCart"
            expect(client.getServerCapabilities()?.tools).toEqual({ listChanged: true })

            // 1. The hub's tools, listed and called through /hub.
            yield* names(client).pipe(
              Effect.filterOrFail((n) => n.includes(getCart)),
              Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 250 }),
              Effect.orDie
            )
            const listed = yield* names(client)
            expect(listed).toEqual(expect.arrayContaining([getCart, "browser_create_tab", "browser_screenshot", "browser_navigate", "browser_cdp"]))
            expect(textOf(yield* call(client, getCart, { text: "x" }))).toBe("shop:getCart:x")

            // 2. A second tab's new tool reaches the host as list_changed, then in the list.
            const before = changes.length
            yield* tab(first.ws, page("docs", ["search"]), { user: "alice", tabId: 2, url: "https://docs.example.org/" })
            yield* until(() => changes.length > before, "notifications/tools/list_changed at the host", "20 millis")
            expect(yield* names(client)).toContain("website_tool_docs_example_org_tab2_search")

            // 3. The browser, through /mcp and the extension.
            const opened = yield* call(client, "browser_create_tab", { url: "https://example.com/" })
            expect(opened.isError).toBeFalsy()
            expect(JSON.parse(textOf(opened) ?? "")).toEqual({ tabId: 42, url: "https://example.com/" })
            const shot = yield* call(client, "browser_screenshot", {})
            expect(shot.content).toEqual([{ type: "image", data: PNG, mimeType: "image/png" }])
            expect(requests.map((r) => [r.method, r.params])).toEqual([
              ["createTab", { url: "https://example.com/" }],
              ["screenshot", {}]
            ])
            const refused = yield* call(client, "browser_click", { selector: "#buy" })
            expect(refused).toMatchObject({ isError: true, content: [{ type: "text", text: expect.stringContaining("click is not supported by this fake") }] })

            // 4. Switchboard goes away: calls say so at once, and the bridge lives on.
            yield* first.stop
            const down = `Switchboard at ${first.url} is unreachable; reconnecting`
            expect(yield* call(client, getCart)).toEqual({ isError: true, content: [{ type: "text", text: down }] })
            expect(yield* call(client, "browser_get_tabs")).toEqual({ isError: true, content: [{ type: "text", text: down }] })
            // The last hub list stays, so the host's tools do not flicker through a blip.
            expect(yield* names(client)).toEqual(expect.arrayContaining([getCart, "browser_get_tabs"]))
            const pid = transport.pid
            expect(pid).toBeTypeOf("number")
            expect(() => process.kill(pid ?? 0, 0)).not.toThrow()

            // 5. A new Switchboard on the same port, and a new tab: the bridge reconnects by itself.
            const restarted = changes.length
            const second = yield* switchboard(port)
            yield* tab(second.ws, page("shop-again", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/cart" }).pipe(Scope.extend(second.scope))
            yield* until(() => changes.length > restarted, "list_changed after the hub came back", "20 millis")
            const again = yield* call(client, getCart, { text: "y" }).pipe(
              Effect.filterOrFail((r) => textOf(r) === "shop-again:getCart:y"),
              Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 200 }),
              Effect.orDieWith((r) => new Error(`the page tool never worked again; last: ${JSON.stringify(r)}`))
            )
            expect(again.isError).toBeFalsy()
            expect(stderr()).toMatch(/hub: connection to http:\/\/127\.0\.0\.1:\d+ lost; reconnecting in \d+ ms/)
            expect(stderr()).toMatch(/hub: reconnected to/)
            yield* until(() => /browser: reconnected to/.test(stderr()), "the bridge back on /mcp", "20 millis")
            // The new Switchboard has no extension of alice's: the browser tools say so.
            expect(yield* call(client, "browser_get_tabs")).toEqual({
              isError: true,
              content: [{ type: "text", text: "no browser extension is connected for this user" }]
            })

            // 6. The host quits: stdin closes and the bridge stops by itself, before the SDK would kill it.
            const quitting = Date.now()
            yield* Effect.promise(() => client.close())
            expect(Date.now() - quitting).toBeLessThan(2_000)
            expect(stderr()).toContain("the host closed stdin; stopping")
          })
        )
      }),
    60_000
  )

  it.scopedLive("a browser tool called as soon as the host has initialized waits for the bridge's first connection", () =>
    Effect.gen(function*() {
      const port = yield* freePort
      const sb = yield* switchboard(port)
      const ext = yield* extensionOf(sb.ws, "alice")
      yield* answering(ext.c, [])
      const { client, stderr } = yield* host(sb.url, "alice")
      // No list, no wait: the host's very first request is a browser call.
      yield* explained(stderr, Effect.gen(function*() {
        const opened = yield* call(client, "browser_create_tab", { url: "https://example.com/first" })
        expect(opened.isError).toBeFalsy()
        expect(JSON.parse(textOf(opened) ?? "")).toEqual({ tabId: 42, url: "https://example.com/first" })
      }))
    }), 60_000)

  it.scopedLive("passes the host's progress token and cancellation through to the page, and its progress back", () =>
    Effect.gen(function*() {
      const port = yield* freePort
      const { url, ws } = yield* switchboard(port)
      const aborted = yield* Deferred.make<void>()
      const server = new McpServer({ name: "slow", version: "1.0.0" })
      server.registerTool("work", { description: "reports progress, then waits until cancelled", inputSchema: {} }, async (_args, extra) => {
        for (const progress of [1, 2]) {
          await extra.sendNotification({ method: "notifications/progress", params: { progressToken: extra._meta?.progressToken ?? "none", progress, total: 3 } })
        }
        await new Promise<void>((resolve) => extra.signal.addEventListener("abort", () => resolve(), { once: true }))
        Deferred.unsafeDone(aborted, Effect.void)
        return { content: [] }
      })
      yield* tab(ws, server, { user: "alice", tabId: 3, url: "https://slow.example.com/" })
      const { client, stderr } = yield* host(url, "alice")
      yield* explained(
        stderr,
        Effect.gen(function*() {
          const work = "website_tool_slow_example_com_tab3_work"
          yield* names(client).pipe(Effect.filterOrFail((n) => n.includes(work)), Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 250 }), Effect.orDie)
          const progress = yield* Queue.unbounded<number>()
          const cancel = new AbortController()
          const pending = client.callTool({ name: work, arguments: {} }, undefined, {
            signal: cancel.signal,
            onprogress: (p) => void Queue.unsafeOffer(progress, p.progress)
          })
          pending.catch(() => {})
          expect([yield* Queue.take(progress), yield* Queue.take(progress)]).toEqual([1, 2])
          cancel.abort("the user changed their mind")
          // The cancellation went host → bridge → hub → tab, and the page's handler saw its signal fire.
          yield* Deferred.await(aborted).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("the page never saw the cancellation") }), Effect.orDie)
        })
      )
    }), 30_000)

  it.scopedLive("a refused token or an unreachable Switchboard fails the host's initialize; a good token still works", () =>
    Effect.gen(function*() {
      const port = yield* freePort
      const sb = yield* switchboard(port)
      const connect = (url: string, jwt: string) =>
        Effect.gen(function*() {
          const transport = new StdioClientTransport({ command: process.execPath, args: [bin, "--url", url, "--token", jwt, "--no-browser"], stderr: "pipe", cwd: root })
          const lines: Array<string> = []
          transport.stderr?.on("data", (chunk: Buffer) => void lines.push(chunk.toString()))
          const client = new Client({ name: "test-host", version: "0.0.0" })
          yield* Effect.addFinalizer(() => Effect.promise(() => client.close().catch(() => {})))
          const started = Date.now()
          const outcome = yield* Effect.either(Effect.tryPromise(() => client.connect(transport)))
          return { outcome, millis: Date.now() - started, client, stderr: () => lines.join("") }
        })

      // A token the edge refuses (signed, but not by this Switchboard's key): the initialize fails at once.
      const refused = yield* connect(sb.url, "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl")
      expect(refused.outcome._tag, refused.stderr()).toBe("Left")
      const refusal = String(refused.outcome._tag === "Left" ? refused.outcome.left.error : "")
      expect(refusal).toContain(`Switchboard at ${sb.url} refused the token (HTTP 401): check --token or SWITCHBOARD_TOKEN`)
      // At once, not after the bounded wait (the child's start-up, several seconds under tsx, is in any timing here).
      expect(refusal).not.toContain("waited")
      // And it stops trying: one refusal on stderr, not a reconnect loop.
      expect(refused.stderr()).toContain("not retrying until restarted with another configuration")
      expect(refused.stderr()).not.toMatch(/reconnecting in/)

      // Nothing listens at the URL: the initialize fails after the bridge's bounded wait.
      const nowhere = `http://127.0.0.1:${yield* freePort}`
      const unreachable = yield* connect(nowhere, yield* token({ sub: "alice" }))
      expect(unreachable.outcome._tag, unreachable.stderr()).toBe("Left")
      expect(String(unreachable.outcome._tag === "Left" ? unreachable.outcome.left.error : "")).toMatch(
        new RegExp(`cannot reach Switchboard at ${nowhere} \\(.*ECONNREFUSED.*; waited 5000 ms\\): check --url`)
      )
      expect(unreachable.millis).toBeGreaterThanOrEqual(5_000)

      // A good token: the same bridge initializes and lists the hub's tools.
      yield* tab(sb.ws, page("shop", ["getCart"]), { user: "alice", tabId: 1, url: "https://shop.example.com/cart" })
      const good = yield* connect(sb.url, yield* token({ sub: "alice" }))
      expect(good.outcome._tag, good.stderr()).toBe("Right")
      yield* names(good.client).pipe(
        Effect.filterOrFail((n) => n.includes("website_tool_shop_example_com_tab1_getCart")),
        Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 250 }),
        Effect.orDie
      )
    }), 60_000)

  it.scopedLive("an unknown tool is -32602 and a cached tool no tab can serve is -32001 TabNotFound, each with one prefix", () =>
    Effect.gen(function*() {
      const port = yield* freePort
      const sb = yield* switchboard(port)
      const first = yield* tab(sb.ws, page("first", ["compose"], { cache: true }), { user: "alice", tabId: 5, url: "https://mail.example.net/inbox" })
      const { client, stderr } = yield* host(sb.url, "alice")
      yield* explained(stderr, Effect.gen(function*() {
        const cached = "website_tool_mail_example_net_compose"
        yield* names(client).pipe(Effect.filterOrFail((n) => n.includes(cached)), Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 250 }), Effect.orDie)
        yield* Effect.promise(() => first.close())
        yield* names(client).pipe(
          Effect.filterOrFail((n) => !n.includes("website_tool_mail_example_net_tab5_compose")),
          Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 250 }),
          Effect.orDie
        )
        const refusal = (name: string) => Effect.promise(() => client.callTool({ name, arguments: {} }).then(() => undefined, (e: unknown) => e as { code?: number; message?: string }))

        const unknown = yield* refusal("website_tool_nowhere")
        expect(unknown?.code).toBe(-32602)
        expect(unknown?.message).toBe("MCP error -32602: Unknown tool: website_tool_nowhere; tools/list shows what the open tabs offer")

        // Known, cached, but no tab is open and no extension can open one.
        const notFound = yield* refusal(cached)
        expect(notFound?.code).toBe(-32001)
        expect(notFound?.message).toMatch(/^MCP error -32001: TabNotFound: no open tab of mail\.example\.net has compose/)
        expect(notFound?.message).not.toMatch(/MCP error .*MCP error/)
      }))
    }), 60_000)

  it.effect("--help prints the usage on stdout and exits 0; a missing --url exits 2 with the reason on stderr", () =>
    Effect.gen(function*() {
      const help = yield* run(process.execPath, [bin, "--help"])
      expect(help.code).toBe(0)
      expect(help.stdout).toContain("Usage: switchboard-mcp --url <http(s)://host:port> --token <jwt>")
      expect(help.stdout).toContain("--no-browser")
      expect(help.stderr).toBe("")

      const missing = yield* run(process.execPath, [bin, "--token", "t"])
      expect(missing.code).toBe(2)
      expect(missing.stdout).toBe("")
      expect(missing.stderr).toContain("missing --url (or SWITCHBOARD_URL)")

      const unknown = yield* run(process.execPath, [bin, "--url", "http://127.0.0.1:1", "--token", "t", "--bogus"])
      expect(unknown.code).toBe(2)
      expect(unknown.stderr).toContain("Unknown option '--bogus'")
    }), 30_000)

  it.effect("every host snippet in the README has its host's shape and starts the bridge", () =>
    Effect.gen(function*() {
      const readme = readFileSync(`${root}README.md`, "utf8")
      const section = readme.split(/^## Connecting MCP hosts \(stdio\)$/m)[1]?.split(/^## /m)[0] ?? ""
      expect(section).not.toBe("")
      const hosts = section.split(/^### /m).slice(1)
      // The key each host reads its servers from.
      const expected: Record<string, "mcpServers" | "servers"> = { "Claude Desktop": "mcpServers", "Claude Code": "mcpServers", Cursor: "mcpServers", "VS Code": "servers" }
      expect(hosts.map((h) => h.split("\n")[0])).toEqual(Object.keys(expected))

      const local = (s: string) => s.replaceAll("/path/to/switchboard/", root)
      const starts = (command: string, args: ReadonlyArray<string>) =>
        Effect.map(run(command === "node" ? process.execPath : command, [...args.map(local), "--help"]), (r) => {
          expect(r, `${command} ${args.join(" ")}`).toMatchObject({ code: 0, stderr: "" })
          expect(r.stdout).toContain("Usage: switchboard-mcp")
        })

      for (const part of hosts) {
        const host = part.split("\n")[0] ?? ""
        const blocks = [...part.matchAll(/^```json\n([\s\S]*?)^```$/gm)].map((m) => JSON.parse(m[1] ?? "") as Record<string, unknown>)
        expect(blocks, host).toHaveLength(1)
        const config = blocks[0] ?? {}
        const key = expected[host] ?? "mcpServers"
        expect(Object.keys(config).filter((k) => k !== "inputs"), host).toEqual([key])
        const server = (config[key] as Record<string, Record<string, unknown>>)["switchboard"]
        expect(server, host).toMatchObject({ command: "node", args: expect.arrayContaining(["--url", "http://127.0.0.1:8080"]), env: { SWITCHBOARD_TOKEN: expect.any(String) } })
        if (host === "VS Code" || host === "Claude Code") expect(server?.["type"], host).toBe("stdio")
        if (host === "VS Code") {
          const inputs = config["inputs"] as Array<Record<string, unknown>>
          expect(server?.["env"]).toEqual({ SWITCHBOARD_TOKEN: `\${input:${String(inputs[0]?.["id"])}}` })
          expect(inputs[0]).toMatchObject({ type: "promptString", password: true })
        }
        const args = server?.["args"] as Array<string>
        expect(args.every((a) => typeof a === "string")).toBe(true)
        yield* starts(String(server?.["command"]), args)
      }

      // And `claude mcp add … -- <command> <args>`.
      const add = /^claude mcp add .* -- (.+)$/m.exec(section)?.[1]
      expect(add).toBeDefined()
      const [command = "", ...args] = (add ?? "").split(" ")
      yield* starts(command, args)
    }), 60_000)
})
