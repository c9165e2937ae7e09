/**
 * The soak check of issue 12 (with Streamable HTTP from issue 13): `npm start`'s process (the all-in-one on the embedded bus, as a real
 * child process) takes a minute of normal users and hostile traffic at once. The normal users'
 * requests must all succeed, every hostile input must get its refusal, the process must never
 * exit, and its heap after a full collection must end within 2 MiB of where it started.
 *
 * The heap baseline is taken after a warm-up round of the same traffic by the same users, so that
 * what is made once (compiled code, the bounded history, pools, each user's state) is in both
 * readings and only growth is measured. Hostile participants take a new id every time, so state
 * kept per id shows up as growth.
 */
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js"
import { describe, expect, it } from "@effect/vitest"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import * as Net from "node:net"
import { closedWith, connect, UpgradeRefused } from "./support/Client.ts"
import * as Inspector from "./support/Inspector.ts"
import { type Envelope, join } from "./support/Participants.ts"
import * as Processes from "./support/Processes.ts"
import { allClosed, expectThat, repeatUntil, Tally } from "./support/Soak.ts"
import { attach, call, client, echoing, extensionOf, type Message, next } from "./support/ProxyPeers.ts"
import { namespace, token } from "./support/Stack.ts"
import { hub, page, tab, textOf, toolsUntil } from "./support/Tabs.ts"

const SOAK = Duration.seconds(Number(process.env["SB_SOAK_SECONDS"] ?? 60))
const WARM_UP = Duration.seconds(15)
const HEAP_SLACK = 2 * 1024 * 1024

/** A frame nested `depth` deep inside a JSON-RPC request (12 KB at 6,000). */
const deep = (depth: number) => `{"jsonrpc":"2.0","id":7,"method":"createTab","params":${"{\"a\":".repeat(depth)}1${"}".repeat(depth)}}`
const deepEnvelope = (from: string, depth: number) =>
  `{"protocol":"mcpx/v0.1","id":"deep-${Math.random()}","from":"${from}","kind":"chat","payload":${"{\"a\":".repeat(depth)}1${"}".repeat(depth)}}`

/** The status line of one raw HTTP request, written as is to a fresh TCP connection. */
const rawStatus = (port: number, request: string) =>
  Effect.async<string>((resume) => {
    const socket = Net.connect(port, "127.0.0.1", () => socket.write(request))
    let answer = ""
    socket.setEncoding("utf8")
    socket.on("data", (chunk: string) => {
      answer += chunk
      if (answer.includes("\r\n")) {
        socket.destroy()
        resume(Effect.succeed(answer.slice(0, answer.indexOf("\r\n"))))
      }
    })
    socket.on("error", (e) => resume(Effect.succeed(`error: ${e.message}`)))
    socket.on("close", () => resume(Effect.succeed(answer === "" ? "closed without an answer" : answer)))
    return Effect.sync(() => socket.destroy())
  // A hang detector with room for a machine whose two cores run the rest of the suite as well.
  }).pipe(Effect.timeout("15 seconds"), Effect.orElseSucceed(() => "no answer within 15s"))

const upgradeHeaders = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"

/** Every kind of traffic at once against `proc` until `duration` has passed; returns what it saw. */
const traffic = (proc: Processes.EdgeProcess, duration: Duration.DurationInput) =>
  Effect.gen(function*() {
    const tally = new Tally()
    const ws = proc.ws
    const scope = yield* Scope.make()
    const done = yield* Deferred.make<void>()
    const inScope = <A, E>(effect: Effect.Effect<A, E, Scope.Scope>) => Scope.extend(effect, scope)
    /** The traffic loops, awaited once `done` tells them to stop. */
    const loops: Array<Fiber.RuntimeFiber<void>> = []
    const loop = (body: Effect.Effect<void>) => Effect.tap(Effect.forkIn(body, scope), (fiber) => Effect.sync(() => loops.push(fiber)))
    const forkLoop = <E>(what: string, pace: Duration.DurationInput, body: Effect.Effect<void, E, Scope.Scope>) =>
      loop(repeatUntil(done, pace, tally.run(what, Effect.scoped(body))))

    // --- normal users -------------------------------------------------------------------------

    // The proxy: alice's client asks her extension, which echoes every request.
    const alice = "alice"
    const ext = yield* inScope(extensionOf(ws, alice))
    yield* inScope(echoing(ext.c))
    const mcp = yield* inScope(client(ws, alice))
    const connectionId = yield* attach(mcp, ext.id)
    let n = 10
    yield* loop(
      repeatUntil(
        done,
        "2 millis",
        tally.run(
          "normal: proxy createTab",
          Effect.gen(function*() {
            const id = n++
            const answer = yield* call(mcp, id, "createTab", { url: "https://example.com", n: id })
            if (JSON.stringify(answer) !== JSON.stringify({ jsonrpc: "2.0", id, result: { method: "createTab", params: { url: "https://example.com", n: id } } })) {
              return yield* Effect.dieMessage(`unexpected answer ${JSON.stringify(answer)}`)
            }
          })
        )
      )
    )

    // The tool hub: a tab's tool called by the SDK client through /hub.
    const bob = "bob"
    yield* inScope(tab(ws, page("soak", ["echo"]), { user: bob, tabId: 1, url: "https://soak.example.com/" }))
    const { client: hubClient } = yield* inScope(hub(ws, bob))
    const [tool] = yield* toolsUntil(hubClient, (names) => names.length === 1)
    let calls = 0
    yield* loop(
      repeatUntil(
        done,
        "2 millis",
        tally.run(
          "normal: hub tools/call",
          Effect.gen(function*() {
            const text = `call ${calls++}`
            const result = yield* Effect.promise(() => hubClient.callTool({ name: tool!.name, arguments: { text } }))
            if (textOf(result) !== `soak:echo:${text}`) return yield* Effect.dieMessage(`unexpected result ${JSON.stringify(result)}`)
          })
        )
      )
    )

    // The tool hub over Streamable HTTP: one long session calling the same tool, and a session
    // opened, used and deleted every round (what a host that restarts often leaves behind).
    const bobToken = yield* token({ sub: bob })
    const httpClient = (name: string) =>
      Effect.acquireRelease(
        Effect.promise(async () => {
          const c = new Client({ name, version: "0.0.0" })
          const transport = new StreamableHTTPClientTransport(new URL(`${proc.url}/hub`), { requestInit: { headers: { Authorization: `Bearer ${bobToken}` } } })
          await c.connect(transport)
          return { c, transport }
        }),
        ({ c, transport }) => Effect.promise(() => transport.terminateSession().then(() => c.close()))
      )
    const httpCall = (c: Client, text: string) =>
      Effect.gen(function*() {
        const result = yield* Effect.promise(() => c.callTool({ name: tool!.name, arguments: { text } }))
        if (textOf(result) !== `soak:echo:${text}`) return yield* Effect.dieMessage(`unexpected result ${JSON.stringify(result)}`)
      })
    const { c: longHttp } = yield* inScope(httpClient("soak-http"))
    let httpCalls = 0
    yield* loop(repeatUntil(done, "2 millis", tally.run("normal: hub tools/call over Streamable HTTP", httpCall(longHttp, `http ${httpCalls++}`))))
    yield* forkLoop(
      "normal: Streamable HTTP session opened, used and deleted",
      "50 millis",
      Effect.flatMap(httpClient("soak-http-short"), ({ c }) => httpCall(c, "short"))
    )

    // An MCPx room: carol chats, dave hears every message (paced under the chat rate limit).
    const topic = "soak"
    const carol = yield* inScope(join(ws, topic, { id: "carol", privilege: "full" }))
    const dave = yield* inScope(join(ws, topic, { id: "dave", privilege: "full" }))
    yield* loop(
      repeatUntil(
        done,
        "20 millis",
        tally.run(
          "normal: mcpx chat",
          Effect.gen(function*() {
            const sent = carol.send({ kind: "chat", payload: { text: "hello" } })
            const heard = yield* dave.next("chat")
            if (heard.id !== sent.id) return yield* Effect.dieMessage(`dave heard ${JSON.stringify(heard)} instead of ${sent.id}`)
          })
        )
      )
    )
    const reader = yield* token({ sub: "reader" })
    yield* forkLoop(
      "normal: history read",
      "100 millis",
      Effect.gen(function*() {
        const res = yield* Effect.promise(() => fetch(`${proc.url}/v0/topics/${topic}/history?limit=20`, { headers: { authorization: `Bearer ${reader}` } }))
        const body = yield* Effect.promise(() => res.text())
        if (res.status !== 200) return yield* Effect.dieMessage(`history answered ${res.status} ${body}`)
      })
    )

    // --- hostile traffic ---------------------------------------------------------------------

    yield* forkLoop(
      "hostile: malformed request targets",
      "20 millis",
      Effect.gen(function*() {
        for (
          const request of [
            "GET // HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET http://[::1 HTTP/1.1\r\nHost: x\r\n\r\n",
            `GET // HTTP/1.1\r\nHost: x\r\n${upgradeHeaders}\r\n`,
            `GET http://[::1 HTTP/1.1\r\nHost: x\r\n${upgradeHeaders}\r\n`
          ]
        ) {
          const status = yield* rawStatus(proc.port, request)
          yield* expectThat(/^HTTP\/1\.1 (400|404) /.test(status), { request, status })
        }
      })
    )

    const mallory = yield* token({ sub: "mallory" })
    yield* forkLoop(
      "hostile: malformed % escapes",
      "20 millis",
      Effect.gen(function*() {
        const started = Date.now()
        const res = yield* Effect.promise(() => fetch(`${proc.url}/v0/topics/%E0%A4%A/participants`, { headers: { authorization: `Bearer ${mallory}` } }))
        yield* Effect.promise(() => res.text())
        // Prompt, not hung: the bound is a hang detector with room for a loaded machine, not a speed check.
        yield* expectThat(res.status === 400 && Date.now() - started < 15_000, { status: res.status, ms: Date.now() - started })
      })
    )

    yield* forkLoop(
      "hostile: deep, invalid and oversized frames on /mcp",
      "20 millis",
      Effect.gen(function*() {
        const c = yield* connect(`${ws}/mcp`)
        const errorCode = (m: unknown) => ((m as Message).error as { code?: number } | undefined)?.code
        const frames = Effect.gen(function*() {
          c.send(deep(6_000))
          const deepAnswer = yield* next(c)
          yield* expectThat(errorCode(deepAnswer) === -32700, deepAnswer)
          c.send("{not json")
          const invalid = yield* next(c)
          yield* expectThat(errorCode(invalid) === -32700, invalid)
          c.send({ jsonrpc: "2.0", id: { not: "an id" }, method: 42 })
          const wrong = yield* next(c)
          yield* expectThat(errorCode(wrong) === -32600, wrong)
          c.send("x".repeat(1024 * 1024 + 1))
          const { code } = yield* closedWith(c)
          yield* expectThat(code === 1009, { code })
        })
        // The socket never sends its mcp_handshake: on a machine slow enough for the four frames to
        // take ROUTER_AUTH_TIMEOUT (2 s), the router's deadline closes it first, at whichever step
        // it has reached, and rightly so.
        const deadlineClosed = Deferred.poll(c.closed).pipe(
          Effect.flatMap((closed) => Option.isSome(closed) ? closed.value : Effect.succeed({ code: 0, reason: "" })),
          Effect.map(({ code, reason }) => code === 1008 && reason.includes("no mcp_handshake in time"))
        )
        yield* frames.pipe(Effect.catchAllDefect((defect) => Effect.flatMap(deadlineClosed, (ok) => ok ? Effect.void : Effect.die(defect))))
      })
    )

    // Tokens live whole seconds: this one is expired once the first second of traffic has passed.
    const expiring = yield* token({ sub: "mallory", ttl: "1 second" })
    const expiredAt = Date.now() + 2_100
    yield* forkLoop(
      "hostile: bad and expired tokens",
      "20 millis",
      Effect.gen(function*() {
        for (const bad of Date.now() > expiredAt ? ["bad", expiring, `${mallory}x`] : ["bad", `${mallory}x`]) {
          const refused = yield* Effect.either(connect(`${ws}/v0/ws?topic=${topic}&token=${bad}`))
          const status = refused._tag === "Left" && refused.left instanceof UpgradeRefused ? refused.left.status : refused._tag
          yield* expectThat(status === 401, { token: bad.slice(-12), status })
        }
      })
    )

    yield* forkLoop(
      "hostile: anonymous sockets held open",
      "100 millis",
      Effect.gen(function*() {
        yield* Effect.forEach(Array.from({ length: 20 }), () => connect(`${ws}/mcp`), { concurrency: 20 })
        yield* Effect.sleep("1 second")
      })
    )

    yield* forkLoop(
      "hostile: Streamable HTTP without a token, with bad JSON, an unknown session, a wrong Accept and an oversized body",
      "20 millis",
      Effect.gen(function*() {
        const json = { "content-type": "application/json", accept: "application/json, text/event-stream" }
        const authed = { ...json, authorization: `Bearer ${mallory}` }
        const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"m","version":"0"}}}`
        const cases: ReadonlyArray<readonly [number, RequestInit]> = [
          [401, { method: "POST", headers: json, body: initialize }],
          [400, { method: "POST", headers: authed, body: "{not json" }],
          [404, { method: "POST", headers: { ...authed, "mcp-session-id": crypto.randomUUID() }, body: `{"jsonrpc":"2.0","id":2,"method":"tools/list"}` }],
          [406, { method: "POST", headers: { ...authed, accept: "text/html" }, body: initialize }]
        ]
        for (const [expected, init] of cases) {
          const res = yield* Effect.promise(() => fetch(`${proc.url}/hub`, init).catch((e: unknown) => ({ status: String(e), text: async () => "" })))
          yield* Effect.promise(() => res.text().catch(() => ""))
          yield* expectThat(res.status === expected, { expected, status: res.status })
        }
        // Refused on its declared length, before the body is read (fetch would see its upload cut).
        const oversized = yield* rawStatus(
          proc.port,
          `POST /hub HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer ${mallory}\r\nContent-Type: application/json\r\nAccept: ${json.accept}\r\nContent-Length: ${5 * 1024 * 1024}\r\n\r\n{"jsonrpc"`
        )
        yield* expectThat(oversized.startsWith("HTTP/1.1 413 "), { expected: 413, status: oversized })
      })
    )

    // Another user's extension answers alice's requests by their mapped ids; alice must only ever
    // see her own extension's answers (the check in the proxy loop above).
    const intruder = yield* inScope(extensionOf(ws, "mallory"))
    let forged = 10
    yield* forkLoop(
      "hostile: forged replies to another user's connection",
      "5 millis",
      Effect.sync(() => {
        for (let i = 0; i < 20; i++) intruder.c.send({ jsonrpc: "2.0", id: `${connectionId}:${forged + i}`, result: { forged: true } })
        forged = n
      })
    )

    yield* forkLoop(
      "hostile: second mcp_handshake as another user",
      "50 millis",
      Effect.gen(function*() {
        const c = yield* client(ws, "mallory")
        const again = yield* call(c, 2, "mcp_handshake", { accessToken: yield* token({ sub: alice }) })
        yield* expectThat((again.error as { code?: number } | undefined)?.code === -32001, again)
      }).pipe(
        // On a machine slow enough for the first handshake's check to take ROUTER_AUTH_TIMEOUT
        // (2 s; seen while the chaos suite shared the cores), the router's deadline closes the
        // socket before its answer, and rightly so: this workload is about the second handshake.
        Effect.catchAllDefect((defect) => String(defect).includes("no mcp_handshake in time") ? Effect.void : Effect.die(defect))
      )
    )

    yield* forkLoop(
      "hostile: mcpx spoofing, reserved names, gateway kinds, deep envelopes and floods",
      "50 millis",
      Effect.gen(function*() {
        const m = yield* join(ws, topic, { id: `mallory-${Math.random()}`, privilege: "full" })
        // The room's own chat reaches mallory too; the gateway's answers to her are what count.
        const nextSystem: Effect.Effect<Envelope> = Effect.flatMap(m.nextAny, (e) => (e.kind === "system" ? Effect.succeed(e) : nextSystem))
        const refusal = (sent: unknown) =>
          Effect.gen(function*() {
            const answer = yield* nextSystem
            yield* expectThat(answer.payload["event"] === "error", { sent, answer })
            return answer.payload["code"]
          })
        m.send({ kind: "chat", from: carol.id, payload: { text: "I am carol" } })
        yield* expectThat((yield* refusal("spoofed")) === "spoofed_from", "spoofed from")
        m.send({ kind: "presence", payload: { event: "join", participant: { id: carol.id, privilege: "full" } } })
        yield* expectThat((yield* refusal("presence")) === "forbidden_kind", "presence from a participant")
        m.sendRaw(deepEnvelope(m.id, 6_000))
        yield* expectThat((yield* refusal("deep")) === "invalid_envelope", "deep envelope")
        for (let i = 0; i < 300; i++) m.send({ kind: "chat", from: "nobody", payload: { i } })
        for (let i = 0; i < 300; i++) yield* refusal("flood")
        const gateway = yield* Effect.either(join(ws, topic, { id: "system:gateway" }))
        yield* expectThat(gateway._tag === "Left", "a participant named system:gateway was welcomed")
      }).pipe(Effect.catchAllDefect((d) => (String(d).includes("system:gateway's socket was closed") ? Effect.void : Effect.die(d))))
    )

    yield* forkLoop(
      "hostile: a tab registering thousands of bad tools",
      "1 second",
      Effect.gen(function*() {
        const c = yield* connect(`${ws}/tabs?token=${mallory}`)
        c.send({ jsonrpc: "2.0", method: "browser/hello", params: { tabId: 1, url: "https://evil.example.com/" } })
        const tools = Array.from({ length: 5_000 }, (_, i) => ({ name: `bad tool ${i} ${"x".repeat(20)}`, inputSchema: "nope" }))
        c.send({ jsonrpc: "2.0", id: 1, method: "browser/registerTools", params: { tools } })
        c.send(`{"jsonrpc":"2.0","id":2,"method":"browser/registerTools","params":${"[".repeat(6_000)}${"]".repeat(6_000)}}`)
        const answers = [(yield* next(c)) as Message, (yield* next(c)) as Message]
        yield* expectThat(answers.some((a) => a.id === 1) && answers.some((a) => a.id === null || a.id === 2), answers)
      })
    )

    yield* Effect.sleep(duration)
    yield* Deferred.succeed(done, undefined)
    // Every loop finishes the round it is in; then sockets close with the scope.
    yield* Fiber.awaitAll(loops).pipe(
      Effect.timeoutFail({ duration: "30 seconds", onTimeout: () => new Error("a traffic loop did not finish its round within 30s") }),
      Effect.orDie
    )
    yield* Scope.close(scope, Exit.void)
    return tally
  })

describe("soak", () => {
  it.scopedLive("a minute of hostile and normal traffic: normal requests all succeed, the process stays up, the heap stays flat", () =>
    Effect.gen(function*() {
      const proc = yield* Processes.allInOne({
        namespace: namespace(),
        nodeArgs: ["--inspect=127.0.0.1:0"],
        env: {
          LOG_LEVEL: "info",
          ROUTER_AUTH_TIMEOUT: "2 seconds",
          REGISTRY_AUTH_TIMEOUT: "2 seconds",
          MCPX_HISTORY_LIMIT: "200"
        }
      })
      const inspector = yield* Inspector.attach(proc)

      const warmUp = yield* traffic(proc, WARM_UP)
      expect(warmUp.failures).toEqual([])
      yield* allClosed(proc)
      const before = yield* inspector.heapAfterGc

      const soak = yield* traffic(proc, SOAK)
      yield* allClosed(proc)
      const after = yield* inspector.heapAfterGc

      const counts = Object.fromEntries(soak.counts)
      console.log(JSON.stringify({ soak: "hostile+normal", seconds: Duration.toSeconds(SOAK), heapBefore: before, heapAfter: after, growth: after - before, counts }))
      expect(soak.failures).toEqual([])
      // Each workload ran, and kept running: a starved request fails on its own deadline (above).
      // How many fit in the minute is the machine's, not the product's: 31 to 88 on two cores
      // shared with two CPU-bound jobs, over 100 on a quiet one.
      for (
        const workload of [
          "normal: proxy createTab",
          "normal: hub tools/call",
          "normal: hub tools/call over Streamable HTTP",
          "normal: Streamable HTTP session opened, used and deleted",
          "normal: mcpx chat",
          "normal: history read"
        ]
      ) {
        expect(counts[workload] ?? 0, workload).toBeGreaterThan(10)
      }
      expect(Object.keys(counts).filter((k) => k.startsWith("hostile:")).length).toBe(10)
      // The same process all along: it never exited, so nothing restarted it.
      expect(() => process.kill(proc.pid, 0)).not.toThrow()
      expect(after - before).toBeLessThan(HEAP_SLACK)
    }), { timeout: 180_000 })
})
