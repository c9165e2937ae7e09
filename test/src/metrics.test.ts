/**
 * Every service's Prometheus metrics, deployed as in production: auth, router, registry, broker
 * and an edge as separate OS processes on a real NATS, each serving `/metrics` on a port of its own
 * (`METRICS_PORT=0`). Real traffic (a proxy round trip, an MCPx message, hub tool calls) moves the
 * numbers, and each process's endpoint is scraped over HTTP.
 */
import { describe, expect, it } from "@effect/vitest"
import { NatsServer } from "@switchboard/testing"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import { createHmac } from "node:crypto"
import type * as Scope from "effect/Scope"
import { WebSocket } from "ws"
import * as Participants from "./support/Participants.ts"
import * as Processes from "./support/Processes.ts"
import { attach, client, extensionOf, next } from "./support/ProxyPeers.ts"
import { namespace, SECRET } from "./support/Stack.ts"
import { hub, page, tab, textOf, toolsUntil } from "./support/Tabs.ts"

/** Samples by series, exactly as written (`name{label="value",...}`); HELP/TYPE lines are checked apart. */
const parse = (text: string): ReadonlyMap<string, number> => {
  const samples = new Map<string, number>()
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue
    const cut = line.lastIndexOf(" ")
    samples.set(line.slice(0, cut), Number(line.slice(cut + 1)))
  }
  return samples
}

const get = (url: string) =>
  Effect.promise(async () => {
    const res = await fetch(url)
    return { status: res.status, type: res.headers.get("content-type"), body: await res.text() }
  })

const scrape = (base: string) => Effect.map(get(`${base}/metrics`), ({ body }) => parse(body))

/** Scrapes until `ok` holds of the samples: the numbers move on the other side of a process boundary. */
const scrapeUntil = (base: string, ok: (s: ReadonlyMap<string, number>) => boolean, what: string) =>
  Effect.flatMap(scrape(base), (s) => (ok(s) ? Effect.succeed(s) : Effect.fail(s))).pipe(
    Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 200 }),
    Effect.catchAll((last) => Effect.dieMessage(`never: ${what}; last scrape:\n${[...last].map(([k, v]) => `${k} ${v}`).join("\n")}`))
  )

/** The sum of every sample of `name` whose labels include `labels`. */
const total = (s: ReadonlyMap<string, number>, name: string, labels: Readonly<Record<string, string>> = {}) => {
  let sum = 0
  for (const [series, value] of s) {
    if (series !== name && !series.startsWith(`${name}{`)) continue
    if (Object.entries(labels).every(([k, v]) => series.includes(`${k}="${v}"`))) sum += value
  }
  return sum
}

/** A page with one tool that answers and one that throws (an MCP error result). */
const mixedPage = () => {
  const server = page("shop", ["getCart"])
  server.registerTool("explode", { description: "always fails" }, () => {
    throw new Error("out of stock")
  })
  return server
}

/** A JWT signed with the deployment's secret, claims as given (the token CLI refuses a past expiry). */
const hs256 = (claims: object) => {
  const part = (value: object) => Buffer.from(JSON.stringify(value)).toString("base64url")
  const signed = `${part({ alg: "HS256", typ: "JWT" })}.${part(claims)}`
  return `${signed}.${createHmac("sha256", SECRET).update(signed).digest("base64url")}`
}

/** The HTTP status of a refused upgrade. */
const refused = (url: string) =>
  Effect.async<number>((resume) => {
    const ws = new WebSocket(url)
    // Ending a handshake that was refused reports an error; the status is what this reads.
    ws.on("error", () => {})
    ws.on("unexpected-response", (_req, res) => {
      resume(Effect.succeed(res.statusCode ?? 0))
      ws.terminate()
    })
    ws.on("open", () => {
      resume(Effect.dieMessage(`${url} was not refused`))
      ws.close()
    })
  })

const withNats = <A, E>(test: Effect.Effect<A, E, NatsServer | Scope.Scope>) => Effect.scoped(test).pipe(Effect.provide(NatsServer.layer))

describe("metrics of every service", () => {
  it.live("each process serves /metrics and /healthz, and real traffic moves its numbers", () =>
    Effect.gen(function*() {
      const { url } = yield* NatsServer
      // A short request timeout, so that a request the extension never answers times out within the test.
      const deployment = yield* Processes.deployment(url, { edges: 1, registry: true, env: { ROUTER_REQUEST_TIMEOUT: "1s" } })
      const broker = yield* Processes.broker({ natsUrl: url, namespace: deployment.namespace })
      const [edge] = deployment.edges
      if (edge === undefined || deployment.registry === undefined) return yield* Effect.dieMessage("no edge or no registry")
      const [auth, router, registry, brokerMetrics, edgeMetrics] = yield* Effect.all(
        [deployment.auth, deployment.router, deployment.registry, broker, edge].map(Processes.metricsUrl)
      )

      // Every process: liveness, and the exposition format Prometheus asks for.
      for (const base of [auth, router, registry, brokerMetrics, edgeMetrics]) {
        expect(yield* get(`${base!}/healthz`)).toMatchObject({ status: 200, body: "ok\n" })
        const metrics = yield* get(`${base!}/metrics`)
        expect(metrics.status).toBe(200)
        expect(metrics.type).toMatch(/^text\/plain; version=0\.0\.4/)
      }
      // Declared from the start, so dashboards see 0 rather than no data.
      const routerStart = yield* scrape(router!)
      expect(routerStart.get(`switchboard_handoffs_total{service="router"}`)).toBe(0)
      expect(routerStart.get(`switchboard_adoptions_total{service="router"}`)).toBe(0)
      // The edge's own metrics are on its metrics port too.
      expect(total(yield* scrape(edgeMetrics!), "switchboard_edge_frames_in_total")).toBeGreaterThan(0)

      // --- a proxy round trip: actors by kind, a pending request, KV latency ---
      const ext = yield* extensionOf(edge.ws, "alice")
      const mcp = yield* client(edge.ws, "alice")
      const connectionId = yield* attach(mcp, ext.id)
      mcp.send({ jsonrpc: "2.0", id: 7, method: "createTab", params: { url: "https://example.com" } })
      const forwarded = yield* next(ext.c)
      expect(forwarded).toMatchObject({ id: `${connectionId}:7`, method: "createTab" })
      const inFlight = yield* scrape(router!)
      expect(inFlight.get(`switchboard_actors{service="router",kind="extension"}`)).toBe(1)
      expect(inFlight.get(`switchboard_actors{service="router",kind="client"}`)).toBe(1)
      expect(inFlight.get(`switchboard_pending_requests{service="router"}`)).toBe(1)
      ext.c.send({ jsonrpc: "2.0", id: forwarded.id, result: { tabId: 1 } })
      expect(yield* next(mcp)).toEqual({ jsonrpc: "2.0", id: 7, result: { tabId: 1 } })
      const answered = yield* scrape(router!)
      expect(answered.get(`switchboard_pending_requests{service="router"}`)).toBe(0)
      // Recording the extension and the connections took KV writes, each timed.
      expect(total(answered, "switchboard_kv_op_seconds_count", { op: "put", outcome: "ok" })).toBeGreaterThan(0)
      expect(total(answered, "switchboard_kv_op_seconds_bucket", { op: "put", outcome: "ok", le: "+Inf" })).toBe(
        total(answered, "switchboard_kv_op_seconds_count", { op: "put", outcome: "ok" })
      )

      // A request the extension leaves unanswered times out (ROUTER_REQUEST_TIMEOUT=1s).
      mcp.send({ jsonrpc: "2.0", id: 8, method: "createTab", params: { url: "https://example.org" } })
      expect(yield* next(ext.c)).toMatchObject({ id: `${connectionId}:8` })
      expect(yield* next(mcp)).toMatchObject({ id: 8, error: { message: expect.stringMatching(/timed out/) } })
      const timedOut = yield* scrape(router!)
      expect(timedOut.get(`switchboard_request_timeouts_total{service="router"}`)).toBe(1)
      expect(timedOut.get(`switchboard_pending_requests{service="router"}`)).toBe(0)

      // --- token checks at the auth service, by outcome ---
      // Signed with the deployment's secret, expired a minute ago: refused as expired, not as forged.
      const expired = hs256({ sub: "alice", exp: Math.floor(Date.now() / 1000) - 60 })
      for (const bad of [expired, "garbage"]) {
        expect(yield* refused(`${edge.ws}/v0/ws?topic=t&token=${bad}`)).toBe(401)
      }
      const checks = yield* scrapeUntil(
        auth!,
        (s) => s.get(`switchboard_token_checks_total{outcome="expired"}`) === 1 && s.get(`switchboard_token_checks_total{outcome="invalid"}`) === 1,
        "the auth service counted one expired and one invalid token"
      )
      expect(checks.get(`switchboard_token_checks_total{outcome="valid"}`)).toBeGreaterThanOrEqual(2)
      expect(checks.get("switchboard_token_check_seconds_count")).toBe(total(checks, "switchboard_token_checks_total"))

      // Closing both sockets ends both actors.
      mcp.ws.close(1000)
      ext.c.ws.close(1000)
      yield* scrapeUntil(
        router!,
        (s) => s.get(`switchboard_actors{service="router",kind="extension"}`) === 0 && s.get(`switchboard_actors{service="router",kind="client"}`) === 0,
        "the router's actors went back to 0 after both sockets closed"
      )

      // --- an MCPx message: participants, journal appends, no sequencer lag left ---
      const topic = "metrics-room"
      const alice = yield* Participants.join(edge.ws, topic, { id: "alice", privilege: "full" })
      const bob = yield* Participants.join(edge.ws, topic, { id: "bob", privilege: "full" })
      const sent = alice.send({ kind: "chat", payload: { text: "hello" } })
      expect(yield* bob.next("chat")).toEqual(Participants.delivered(sent))
      const mcpx = yield* scrapeUntil(
        brokerMetrics!,
        (s) => total(s, "switchboard_journal_append_seconds_count") >= 1 && total(s, "switchboard_sequencer_lag") === 0,
        "the chat was appended to the topic's history and acknowledged"
      )
      expect(mcpx.get(`switchboard_actors{service="broker",kind="participant"}`)).toBe(2)
      expect(total(mcpx, "switchboard_journal_errors_total")).toBe(0)

      // --- hub tool calls: one ok, one error, counted by outcome ---
      yield* tab(edge.ws, mixedPage(), { user: "carol", tabId: 3, url: "https://shop.example.com/" })
      const { client: hubClient } = yield* hub(edge.ws, "carol")
      yield* toolsUntil(hubClient, (names) => names.length === 2)
      expect(textOf(yield* Effect.promise(() => hubClient.callTool({ name: "website_tool_shop_example_com_tab3_getCart", arguments: { text: "x" } })))).toBe(
        "shop:getCart:x"
      )
      const failed = yield* Effect.promise(() => hubClient.callTool({ name: "website_tool_shop_example_com_tab3_explode", arguments: {} }))
      expect(failed).toMatchObject({ isError: true })
      const calls = yield* scrape(registry!)
      expect(calls.get(`switchboard_tool_calls_total{outcome="ok"}`)).toBe(1)
      expect(calls.get(`switchboard_tool_calls_total{outcome="error"}`)).toBe(1)
      expect(calls.get(`switchboard_actors{service="registry",kind="tab"}`)).toBe(1)
      expect(calls.get(`switchboard_actors{service="registry",kind="hub"}`)).toBe(1)
      expect(calls.get(`switchboard_pending_requests{service="registry"}`)).toBe(0)

      // --- a router dies: the survivor adopts its extension, and counts it ---
      // Opened before the survivor starts, so the first router hosts it.
      const orphan = yield* extensionOf(edge.ws, "dave")
      expect((yield* scrape(router!)).get(`switchboard_actors{service="router",kind="extension"}`)).toBe(1)
      const survivor = yield* Processes.router({ natsUrl: url, namespace: deployment.namespace })
      const survivorMetrics = yield* Processes.metricsUrl(survivor)
      yield* deployment.router.kill("SIGKILL")
      const adopted = yield* scrapeUntil(
        survivorMetrics,
        (s) => s.get(`switchboard_adoptions_total{service="router"}`) === 1 && s.get(`switchboard_actors{service="router",kind="extension"}`) === 1,
        "the survivor adopted the dead router's extension"
      )
      expect(adopted.get(`switchboard_handoffs_total{service="router"}`)).toBe(0)
      // The adopted actor is live: the extension still gets answers (its refusal of a request, here).
      expect(yield* Effect.flatMap(Effect.sync(() => orphan.c.send({ jsonrpc: "2.0", id: "ping", method: "ping" })), () => next(orphan.c))).toMatchObject({
        id: "ping",
        error: { code: -32601 }
      })
    }).pipe(withNats), 180_000)

  it.live("npm start serves one endpoint with every service's metrics and the edge's", () =>
    Effect.gen(function*() {
      const server = yield* Processes.allInOne({ namespace: namespace() })
      const base = yield* Processes.metricsUrl(server)
      const ext = yield* extensionOf(server.ws, "alice")
      const s = yield* scrapeUntil(
        base,
        (s) => s.get(`switchboard_actors{service="router",kind="extension"}`) === 1,
        "the all-in-one's router hosts the extension"
      )
      for (const service of ["router", "broker", "registry"]) expect(s.get(`switchboard_handoffs_total{service="${service}"}`)).toBe(0)
      expect(total(s, "switchboard_edge_connections", { path: "/extension" })).toBe(1)
      // The edge's own port keeps only the edge's metrics, so scraping both counts nothing twice.
      const own = parse((yield* get(`${server.url}/metrics`)).body)
      expect(total(own, "switchboard_edge_connections", { path: "/extension" })).toBe(1)
      expect(total(own, "switchboard_actors")).toBe(0)
      expect([...own.keys()].some((k) => k.startsWith("switchboard_actors"))).toBe(false)
      ext.c.ws.close(1000)
    }).pipe(Effect.scoped), 60_000)
})
