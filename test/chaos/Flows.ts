/**
 * Steady traffic on every protocol, each request checked against the one answer that is right for
 * it, and retried as docs/operations.md says a client does. A flow is two peers on two different
 * edges (flow k on slots k and k+1), so an edge's death leaves one flow of each protocol untouched.
 */
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as FiberSet from "effect/FiberSet"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import { isDeepStrictEqual } from "node:util"
import { modernFetch, modernMeta as meta, ModernVersion } from "../src/support/Modern.ts"
import { token } from "../src/support/Stack.ts"
import type { Ledger, Outcome, Protocol } from "./Ledger.ts"
import { type Edges, type Json, type Line, openLine, peer, Policy, Unanswered } from "./Line.ts"

export interface Flow {
  readonly protocol: Protocol
  readonly name: string
  /** The edge slots its peers are on now. */
  readonly slots: () => ReadonlyArray<number | undefined>
  /** One request with the retry policy: every attempt and the final outcome go to the ledger. */
  readonly request: (n: number) => Effect.Effect<void>
  /** Requests a second, when not the driver's. */
  readonly rate?: number
  /** Every request on a new socket, to whichever edge is next: it has no edge of its own. */
  readonly fresh?: boolean
}

interface Answer {
  readonly outcome: Outcome
  readonly detail?: string
}

const correct: Answer = { outcome: "correct" }
const failed = (detail: string): Answer => ({ outcome: "error", detail })

/** Attempts `attempt` until it answers correctly, answers wrongly, or the policy's attempts are spent. */
const withRetry = (ledger: Ledger, protocol: Protocol, flow: string, attempt: Effect.Effect<Answer>) =>
  Effect.gen(function*() {
    /**
     * The phase a request that fails for good is counted in: that of its first failed attempt.
     * Its retries may run ~26 s, past the end of the fault that made it fail (the NATS node's
     * restart) into the next phase (the rolling restart), which it would otherwise be blamed on.
     */
    let failedIn: number | undefined
    for (let i = 0; i < Policy.attempts; i++) {
      const sentAt = Date.now()
      const answer = yield* attempt
      // Counted in the phase it ended in: an attempt in flight when a fault strikes is that fault's.
      ledger.attempt({ protocol, flow, phase: ledger.phase, sentAt, outcome: answer.outcome, ...(answer.detail === undefined ? {} : { detail: answer.detail }) })
      // A wrong answer is not retried: the client would have taken it.
      if (answer.outcome !== "error") {
        ledger.requests.push({ protocol, flow, phase: answer.outcome === "wrong" ? ledger.phase : failedIn ?? ledger.phase, ok: answer.outcome === "correct" })
        return
      }
      failedIn ??= ledger.phase
      if (i + 1 < Policy.attempts) yield* Effect.sleep(Policy.retryPause(i))
    }
    ledger.requests.push({ protocol, flow, phase: failedIn ?? ledger.phase, ok: false })
  })

const asError = (e: unknown): Effect.Effect<Answer> => Effect.succeed(failed(e instanceof Unanswered ? e.reason : String(e)))

const errorOf = (answer: Json): string | undefined => ("error" in answer ? JSON.stringify(answer["error"]) : undefined)

/** Takes what arrives until `ok` holds of a message (others are dropped: keepalives, presence). */
const awaitMessage = (line: Line, ok: (m: Json) => boolean) =>
  Effect.iterate(undefined as Json | undefined, {
    while: (m) => m === undefined || !ok(m),
    body: () => Queue.take(line.incoming)
  }).pipe(Effect.map((m) => m as Json))

// --- MCP Proxy Protocol -------------------------------------------------------------------------

/**
 * An extension (slot k) that answers every forwarded request with `{echo: params}`, and an MCP
 * client (slot k+1) attached to it. The extension sends a `client_id`, so it keeps its
 * `extension_id` across reconnects; the client attaches again after `disconnected`.
 */
export const proxyFlow = (ledger: Ledger, edges: Edges, k: number) =>
  Effect.gen(function*() {
    const name = `proxy/${k}`
    const user = `chaos-proxy-${k}`
    const accessToken = yield* token({ sub: user, ttl: "2 hours" })
    const extensionId = yield* Deferred.make<string>()
    const extension = yield* peer({
      name: `${name} extension`,
      home: k,
      edges,
      url: (ws) => `${ws}/extension`,
      setup: (line) =>
        Effect.gen(function*() {
          const ask = yield* awaitMessage(line, (m) => m["method"] === "authenticate")
          line.send({ jsonrpc: "2.0", id: ask["id"], result: { name: "Chaos", accessToken, client_id: `chaos-browser-${k}` } })
          const done = yield* awaitMessage(line, (m) => m["method"] === "authenticated")
          const id = String((done["params"] as Json | undefined)?.["extension_id"])
          yield* Deferred.succeed(extensionId, id)
          const first = yield* Deferred.await(extensionId)
          if (first !== id) yield* Effect.logError(`${name}: the extension came back as ${id}, not ${first}`)
          return id
        }),
      serve: (line, _state, m) => {
        if (typeof m["method"] === "string" && m["id"] !== undefined) line.send({ jsonrpc: "2.0", id: m["id"], result: { echo: m["params"] ?? null } })
      }
    })
    const attach = (line: Line) =>
      Effect.gen(function*() {
        const id = yield* Deferred.await(extensionId)
        const answer = yield* line.request("connect", { extension_id: id })
        const connection = (answer["result"] as Json | undefined)?.["connection_id"]
        if (typeof connection !== "string") return yield* Effect.fail(new Unanswered({ reason: `connect answered ${JSON.stringify(answer)}` }))
        return connection
      }).pipe(
        // The extension may be reconnecting itself: not found until it is back.
        Effect.retry({ schedule: Schedule.spaced(Policy.retryPause(0)), times: 30 })
      )
    const client = yield* peer({
      name: `${name} client`,
      home: (k + 1) % edges.count,
      edges,
      url: (ws) => `${ws}/mcp`,
      setup: (line) =>
        Effect.gen(function*() {
          const hello = yield* line.request("mcp_handshake", { accessToken })
          if ((hello["result"] as Json | undefined)?.["authenticated"] !== true) {
            return yield* Effect.fail(new Unanswered({ reason: `mcp_handshake answered ${JSON.stringify(hello)}` }))
          }
          return yield* attach(line)
        }),
      serve: (_line, _state, m) => {
        // Its extension went away or came back on a new socket: attach again before sending more.
        if (m["method"] === "disconnected") client.redo(attach)
      }
    })
    const request = (n: number) => {
      const params = { n, nonce: randomUUID() }
      return withRetry(
        ledger,
        "proxy",
        name,
        Effect.gen(function*() {
          const { line } = yield* client.session(Policy.answerTimeout)
          const answer = yield* line.request("chaos/echo", params)
          const error = errorOf(answer)
          if (error !== undefined) return failed(error)
          return isDeepStrictEqual(answer["result"], { echo: params }) ? correct : { outcome: "wrong" as const, detail: JSON.stringify(answer) }
        }).pipe(Effect.catchAll(asError))
      )
    }
    return { protocol: "proxy" as const, name, user, extensionId: Deferred.await(extensionId), slots: () => [extension.slot(), client.slot()], request }
  })

// --- MCP-B: a tab and a /hub client --------------------------------------------------------------

/** A tab (slot k) whose tool `echo` answers with its arguments as text, and a `/hub` session (slot k+1) calling it. */
export const hubFlow = (ledger: Ledger, edges: Edges, k: number) =>
  Effect.gen(function*() {
    const name = `hub/${k}`
    const t = yield* token({ sub: `chaos-hub-${k}`, ttl: "2 hours" })
    const domain = `chaos${k}.example.com`
    const tool = `website_tool_chaos${k}_example_com_tab1_echo`
    const tab = yield* peer({
      name: `${name} tab`,
      home: k,
      edges,
      url: (ws) => `${ws}/tabs?token=${t}`,
      setup: (line) =>
        Effect.gen(function*() {
          const hello = yield* line.request("browser/hello", { tabId: 1, url: `https://${domain}/` })
          const registered = yield* line.request("browser/registerTools", { tools: [{ name: "echo", inputSchema: { type: "object" } }] })
          const error = errorOf(hello) ?? errorOf(registered)
          if (error !== undefined) return yield* Effect.fail(new Unanswered({ reason: error }))
        }),
      serve: (line, _state, m) => {
        if (m["method"] !== "browser/executeTool" || m["id"] === undefined) return
        const args = (m["params"] as Json | undefined)?.["args"]
        line.send({ jsonrpc: "2.0", id: m["id"], result: { success: true, payload: { content: [{ type: "text", text: JSON.stringify(args) }] } } })
      }
    })
    const hub = yield* peer({
      name: `${name} hub`,
      home: (k + 1) % edges.count,
      edges,
      url: (ws) => `${ws}/hub?token=${t}`,
      protocols: ["mcp"],
      setup: (line) =>
        Effect.gen(function*() {
          const init = yield* line.request("initialize", { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "chaos", version: "0" } })
          const error = errorOf(init)
          if (error !== undefined) return yield* Effect.fail(new Unanswered({ reason: error }))
          line.send({ jsonrpc: "2.0", method: "notifications/initialized" })
        }),
      serve: () => undefined
    })
    const request = (n: number) => {
      const args = { n, nonce: randomUUID() }
      return withRetry(
        ledger,
        "hub",
        name,
        Effect.gen(function*() {
          const { line } = yield* hub.session(Policy.answerTimeout)
          const answer = yield* line.request("tools/call", { name: tool, arguments: args })
          const error = errorOf(answer)
          if (error !== undefined) return failed(error)
          const result = answer["result"] as { readonly isError?: boolean; readonly content?: ReadonlyArray<{ readonly text?: string }> } | undefined
          if (result?.isError === true) return failed(JSON.stringify(result))
          return result?.content?.[0]?.text === JSON.stringify(args) ? correct : { outcome: "wrong" as const, detail: JSON.stringify(answer) }
        }).pipe(Effect.catchAll(asError))
      )
    }
    return { protocol: "hub" as const, name, user: `chaos-hub-${k}`, tool, slots: () => [tab.slot(), hub.slot()], request }
  })

// --- MCPx: participants of one topic -------------------------------------------------------------

export const TOPIC = "chaos-room"

/**
 * Participant k (slot k) of the chaos topic. Its envelopes are acknowledged when the topic sends
 * them back to it (every participant gets every accepted envelope, the sender included); one not
 * acknowledged in time is sent again with the same id, which receivers deduplicate. After a
 * reconnect it reads what it missed from the topic's history.
 */
export const mcpxFlow = (ledger: Ledger, edges: Edges, k: number, topic = TOPIC) =>
  Effect.gen(function*() {
    const id = `chaos-agent-${k}`
    const name = `mcpx/${k}`
    const t = yield* token({ sub: id, ttl: "2 hours" })
    const acks = new Map<string, Deferred.Deferred<Answer>>()
    /** Envelope id → the text it was sent with, for every participant of this run. */
    const texts = sentTexts
    /** This participant's own envelopes. */
    const sentIn = new Set<string>()

    const receive = (e: Json) => {
      const envelopeId = e["id"]
      if (typeof envelopeId !== "string") return
      if (e["kind"] === "chat") {
        const text = (e["payload"] as Json | undefined)?.["text"]
        const sent = texts.get(envelopeId)
        if (sent !== undefined && sent.text !== text) ledger.wrongEnvelopes.push({ phase: sent.phase, id: envelopeId, by: id })
        ledger.seen(id, envelopeId)
        if (e["from"] === id) acknowledge(envelopeId, correct, "echo")
        return
      }
      const payload = e["payload"] as Json | undefined
      const correlation = e["correlation_id"]
      if (e["kind"] === "system" && payload?.["event"] === "error" && typeof correlation === "string") {
        // The same id again after a reconnect, already accepted the first time: that is its acknowledgement.
        acknowledge(correlation, payload["code"] === "duplicate_id" ? correct : failed(`${String(payload["code"])} ${String(payload["reason"])}`), "duplicate_id")
      }
    }
    const acknowledge = (envelopeId: string, answer: Answer, how: "echo" | "duplicate_id") => {
      if (answer.outcome === "correct" && !ledger.acked.has(envelopeId) && sentIn.has(envelopeId)) {
        const sent = texts.get(envelopeId)
        ledger.acked.set(envelopeId, { phase: sent?.phase ?? ledger.phase, sentAt: sent?.sentAt ?? 0, at: Date.now(), payload: sent?.text ?? "", how })
      }
      const waiting = acks.get(envelopeId)
      if (waiting !== undefined) Deferred.unsafeDone(waiting, Effect.succeed(answer))
    }

    const catchUp = (line: Line) =>
      Effect.tryPromise(async () => {
        const base = new URL(line.url)
        const http = `http://${base.host}`
        let before: number | null = null
        for (let page = 0, busy = 0; page < 30; page++) {
          const res = await fetch(`${http}/v0/topics/${encodeURIComponent(topic)}/history?limit=1000${before === null ? "" : `&before=${before}`}`, {
            headers: { authorization: `Bearer ${t}` },
            signal: AbortSignal.timeout(5_000)
          })
          // Many participants reconnect at once after a fault: a broker turns reads past its bound
          // away with 503 and Retry-After, and the same page is asked for again, as a client would.
          if (res.status === 503 && res.headers.has("retry-after") && busy++ < 10) {
            await new Promise((resolve) => setTimeout(resolve, Number(res.headers.get("retry-after")) * 1000))
            page--
            continue
          }
          if (res.status !== 200) throw new Error(`history answered ${res.status}: ${await res.text()}`)
          const body = (await res.json()) as { readonly envelopes: ReadonlyArray<Json>; readonly before: number | null; readonly more: boolean }
          const known = body.envelopes.some((e) => ledger.received.get(id)?.has(String(e["id"])) ?? false)
          for (const e of body.envelopes) receive(e)
          if (known || body.before === null || !body.more) return page + 1
          before = body.before
        }
        return 30
      })

    const participant = yield* peer({
      name,
      home: k,
      edges,
      url: (ws) => `${ws}/v0/ws?topic=${encodeURIComponent(topic)}&token=${t}`,
      setup: (line, reconnect) =>
        Effect.gen(function*() {
          const welcome = yield* Queue.take(line.incoming)
          if ((welcome["payload"] as Json | undefined)?.["event"] !== "welcome") {
            return yield* Effect.fail(new Unanswered({ reason: `expected a welcome, got ${JSON.stringify(welcome)}` }))
          }
          if (!ledger.joined.has(id)) ledger.joined.set(id, Date.now())
          if (reconnect) yield* catchUp(line)
        }),
      serve: (_line, _state, m) => receive(m)
    })

    let counter = 0
    const request = (_n: number) => {
      const envelopeId = `${id}-${++counter}`
      const text = randomUUID()
      texts.set(envelopeId, { text, phase: ledger.phase, sentAt: Date.now() })
      sentIn.add(envelopeId)
      return withRetry(
        ledger,
        "mcpx",
        name,
        Effect.gen(function*() {
          if (ledger.acked.has(envelopeId)) return correct
          const { line } = yield* participant.session(Policy.answerTimeout)
          const answer = yield* Deferred.make<Answer>()
          acks.set(envelopeId, answer)
          line.send({ protocol: "mcpx/v0.1", id: envelopeId, from: id, kind: "chat", payload: { text } })
          const closed = Deferred.await(line.closed).pipe(Effect.map(({ code }) => failed(`socket closed (${code})`)))
          return yield* Effect.raceFirst(Deferred.await(answer), closed).pipe(
            Effect.timeoutTo({ duration: Policy.answerTimeout, onTimeout: () => failed("no acknowledgement"), onSuccess: (a) => a }),
            Effect.ensuring(Effect.sync(() => acks.delete(envelopeId)))
          )
        }).pipe(Effect.catchAll(asError))
      )
    }
    return { protocol: "mcpx" as const, name, participant: id, ready: participant.session("60 seconds"), peer: participant, slots: () => [participant.slot()], request }
  })

/** What each MCPx envelope of the run was sent with (shared: every participant checks what it receives). */
const sentTexts = new Map<string, { readonly text: string; readonly phase: number; readonly sentAt: number }>()

// --- new sessions all the time ----------------------------------------------------------------

/**
 * A flow whose every request opens a socket to the next edge that serves, does the protocol's
 * handshake and one request: what a client that arrives after a fault meets (the service's queue
 * group, and the KV writes of a new session). `attempt` gets the edge's ws:// base.
 */
/** New sessions go round the edges, as a load balancer would send them. */
let rotation = 0

const onNewSession = (edges: Edges, attempt: (slot: number, ws: string) => Effect.Effect<Answer, unknown, Scope.Scope>) =>
  Effect.suspend(() => {
    for (let i = 0; i < edges.count; i++) {
      const slot = rotation++ % edges.count
      const ws = edges.at(slot)
      if (ws !== undefined) {
        return Effect.scoped(attempt(slot, ws)).pipe(
          Effect.timeoutTo({ duration: Policy.setupTimeout, onTimeout: () => failed("no answer on a new session"), onSuccess: (a) => a }),
          Effect.catchAll(asError)
        )
      }
    }
    return Effect.succeed(failed("no edge serves"))
  })

const freshFlow = (ledger: Ledger, edges: Edges, protocol: Protocol, name: string, attempt: (slot: number, ws: string) => Effect.Effect<Answer, unknown, Scope.Scope>) => {
  const one = onNewSession(edges, attempt)
  return { protocol, name, fresh: true, rate: 2, slots: () => [], request: () => withRetry(ledger, protocol, name, one) } satisfies Flow
}

const lineAt = (slot: number, url: string, protocols?: ReadonlyArray<string>) =>
  Effect.acquireRelease(openLine(slot, url, protocols), (line) => Effect.sync(() => line.close()))

/** A new MCP client per request, attaching to `of`'s extension. */
export const freshProxyFlow = (ledger: Ledger, edges: Edges, of: { readonly user: string; readonly extensionId: Effect.Effect<string> }) =>
  Effect.gen(function*() {
    const accessToken = yield* token({ sub: of.user, ttl: "2 hours" })
    return freshFlow(ledger, edges, "proxy", "proxy/new", (slot, ws) =>
      Effect.gen(function*() {
        const line = yield* lineAt(slot, `${ws}/mcp`)
        const hello = yield* line.request("mcp_handshake", { accessToken })
        if ((hello["result"] as Json | undefined)?.["authenticated"] !== true) return failed(`mcp_handshake answered ${JSON.stringify(hello)}`)
        const attached = yield* line.request("connect", { extension_id: yield* of.extensionId })
        const refused = errorOf(attached)
        if (refused !== undefined) return failed(refused)
        const params = { fresh: true, nonce: randomUUID() }
        const answer = yield* line.request("chaos/echo", params)
        const error = errorOf(answer)
        if (error !== undefined) return failed(error)
        return isDeepStrictEqual(answer["result"], { echo: params }) ? correct : { outcome: "wrong" as const, detail: JSON.stringify(answer) }
      }))
  })

/** A new `/hub` session per request, calling `of`'s tool. */
export const freshHubFlow = (ledger: Ledger, edges: Edges, of: { readonly user: string; readonly tool: string }) =>
  Effect.gen(function*() {
    const t = yield* token({ sub: of.user, ttl: "2 hours" })
    return freshFlow(ledger, edges, "hub", "hub/new", (slot, ws) =>
      Effect.gen(function*() {
        const line = yield* lineAt(slot, `${ws}/hub?token=${t}`, ["mcp"])
        const init = yield* line.request("initialize", { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "chaos-new", version: "0" } })
        const refused = errorOf(init)
        if (refused !== undefined) return failed(refused)
        line.send({ jsonrpc: "2.0", method: "notifications/initialized" })
        const args = { fresh: true, nonce: randomUUID() }
        const answer = yield* line.request("tools/call", { name: of.tool, arguments: args })
        const error = errorOf(answer)
        if (error !== undefined) return failed(error)
        const result = answer["result"] as { readonly isError?: boolean; readonly content?: ReadonlyArray<{ readonly text?: string }> } | undefined
        if (result?.isError === true) return failed(JSON.stringify(result))
        return result?.content?.[0]?.text === JSON.stringify(args) ? correct : { outcome: "wrong" as const, detail: JSON.stringify(answer) }
      }))
  })

/** A participant that joins the chaos topic for each envelope it sends (the same id on every attempt). */
export const freshMcpxFlow = (ledger: Ledger, edges: Edges, topic = TOPIC) =>
  Effect.gen(function*() {
    const id = "chaos-newcomer"
    const t = yield* token({ sub: id, ttl: "2 hours" })
    // One session at a time, as one client with one participant id has: two at once replace each
    // other ("last one wins"), and when sessions slow down (a replica stopping) each retry opened
    // another that closed the one before, until requests failed past the retry policy.
    const oneAtATime = yield* Effect.makeSemaphore(1)
    let counter = 0
    const name = "mcpx/new"
    const request = () => {
      const envelopeId = `${id}-${++counter}`
      const text = randomUUID()
      const phase = ledger.phase
      const sentAt = Date.now()
      sentTexts.set(envelopeId, { text, phase, sentAt })
      return withRetry(
        ledger,
        "mcpx",
        name,
        oneAtATime.withPermits(1)(onNewSession(edges, (slot, ws) =>
          Effect.gen(function*() {
            const line = yield* lineAt(slot, `${ws}/v0/ws?topic=${encodeURIComponent(topic)}&token=${t}`)
            // A socket closed before its welcome (the broker refused it, say "service did not
            // answer" while a replica stops) is a failed attempt to retry now, not 10 s of waiting.
            const welcome = yield* Effect.raceFirst(
              Queue.take(line.incoming),
              Effect.map(Deferred.await(line.closed), ({ code, reason }) => ({ closed: `${code} ${reason}` }))
            )
            if ("closed" in welcome) return failed(`closed before its welcome: ${String(welcome["closed"])}`)
            if ((welcome["payload"] as Json | undefined)?.["event"] !== "welcome") return failed(`expected a welcome, got ${JSON.stringify(welcome)}`)
            line.send({ protocol: "mcpx/v0.1", id: envelopeId, from: id, kind: "chat", payload: { text } })
            const answer = yield* awaitMessage(line, (m) => m["id"] === envelopeId || m["correlation_id"] === envelopeId).pipe(
              Effect.timeoutTo({ duration: Policy.answerTimeout, onTimeout: () => undefined, onSuccess: (m) => m })
            )
            if (answer === undefined) return failed("no acknowledgement")
            const payload = answer["payload"] as Json | undefined
            const acked = answer["id"] === envelopeId || payload?.["code"] === "duplicate_id"
            if (!acked) return failed(`${String(payload?.["code"])} ${String(payload?.["reason"])}`)
            if (!ledger.acked.has(envelopeId)) ledger.acked.set(envelopeId, { phase, sentAt, at: Date.now(), payload: text, how: answer["id"] === envelopeId ? "echo" : "duplicate_id" })
            return correct
          })))
      )
    }
    return { protocol: "mcpx" as const, name, fresh: true, rate: 2, slots: () => [], request } satisfies Flow
  })

// --- driving them ---------------------------------------------------------------------------------

/**
 * Starts `rate` requests a second on each flow, each in its own fiber (at most 64 in flight per
 * flow, so a stalled system does not pile up fibers). `stop` ends the traffic and waits up to 30 s
 * for requests in flight to finish their retries.
 */
export const drive = (flows: ReadonlyArray<Flow>, rate: number) =>
  Effect.gen(function*() {
    const inflight = new Map<string, number>(flows.map((f) => [f.name, 0]))
    const requests = yield* FiberSet.make()
    const run = yield* FiberSet.runtime(requests)<never>()
    const drivers = yield* FiberSet.make()
    for (const flow of flows) {
      let n = 0
      yield* FiberSet.run(
        drivers,
        Effect.sync(() => {
          if ((inflight.get(flow.name) ?? 0) >= 64) return
          inflight.set(flow.name, (inflight.get(flow.name) ?? 0) + 1)
          run(flow.request(n++).pipe(Effect.ensuring(Effect.sync(() => inflight.set(flow.name, (inflight.get(flow.name) ?? 1) - 1)))))
        }).pipe(Effect.repeat(Schedule.spaced(Duration.millis(1000 / (flow.rate ?? rate)))))
      )
    }
    const stop = Effect.gen(function*() {
      yield* FiberSet.clear(drivers)
      yield* Effect.suspend(() => ([...inflight.values()].every((c) => c === 0) ? Effect.void : Effect.fail("requests in flight"))).pipe(
        Effect.retry({ schedule: Schedule.spaced("100 millis"), times: 300 }),
        Effect.ignore
      )
    })
    return { stop }
  })

// --- MCP 2026-07-28 at /hub: no session, every request on its own ----------------------------------

/** One modern POST to `/hub` at the edge `ws`; its answer, the last JSON-RPC message of an SSE stream included. */
const modernPost = (ws: string, t: string, body: Json) =>
  Effect.tryPromise({
    try: (signal) => modernFetch(ws, body, { token: t, signal }).then((r) => r.json() as Json),
    catch: (e) => new Unanswered({ reason: `POST /hub: ${String(e)}` })
  })

const modernMeta = (tasks: boolean) => meta({ clientName: "chaos-2026", capabilities: tasks ? { extensions: { "io.modelcontextprotocol/tasks": {} } } : {} })

const echoed = (answer: Json, args: Json): Answer => {
  const error = errorOf(answer)
  if (error !== undefined) return failed(error)
  const result = answer["result"] as { readonly isError?: boolean; readonly content?: ReadonlyArray<{ readonly text?: string }> } | undefined
  if (result?.isError === true) return failed(JSON.stringify(result))
  return result?.content?.[0]?.text === JSON.stringify(args) ? correct : { outcome: "wrong", detail: JSON.stringify(answer) }
}

/**
 * MCP 2026-07-28 clients of `of`'s tool, each request to whichever edge is next: a `tools/call`;
 * a `subscriptions/listen` that must be acknowledged; and a task, created on one edge and polled
 * on the next until it completes with the tool's answer.
 */
export const modernHubFlows = (ledger: Ledger, edges: Edges, of: { readonly user: string; readonly tool: string }) =>
  Effect.gen(function*() {
    const t = yield* token({ sub: of.user, ttl: "2 hours" })
    const call = freshFlow(ledger, edges, "hub", "hub-2026/call", (_slot, ws) =>
      Effect.gen(function*() {
        const args = { modern: true, nonce: randomUUID() }
        return echoed(yield* modernPost(ws, t, { jsonrpc: "2.0", id: 1, method: "tools/call", params: { name: of.tool, arguments: args, _meta: modernMeta(false) } }), args)
      }))
    const listen = freshFlow(ledger, edges, "hub", "hub-2026/listen", (_slot, ws) =>
      Effect.tryPromise({
        try: async (signal) => {
          const controller = new AbortController()
          signal.addEventListener("abort", () => controller.abort())
          const res = await fetch(`${ws.replace(/^ws/, "http")}/hub`, {
            method: "POST",
            signal: controller.signal,
            headers: { authorization: `Bearer ${t}`, accept: "application/json, text/event-stream", "content-type": "application/json", "mcp-protocol-version": ModernVersion, "mcp-method": "subscriptions/listen" },
            body: JSON.stringify({ jsonrpc: "2.0", id: "listen", method: "subscriptions/listen", params: { notifications: { toolsListChanged: true }, _meta: modernMeta(false) } })
          })
          if (res.body === null || res.status !== 200) return failed(`subscriptions/listen answered ${res.status}: ${await res.text()}`)
          const reader = res.body.getReader()
          let seen = ""
          // The acknowledgement is the stream's first message; the stream then stays open until closed here.
          while (!seen.includes("notifications/subscriptions/acknowledged")) {
            const { done, value } = await reader.read()
            if (done) return failed(`the listen stream ended before its acknowledgement: ${seen}`)
            seen += new TextDecoder().decode(value)
          }
          controller.abort()
          return seen.includes(`"toolsListChanged":true`) ? correct : { outcome: "wrong" as const, detail: seen }
        },
        catch: (e) => new Unanswered({ reason: `subscriptions/listen: ${String(e)}` })
      }))
    const task = freshFlow(ledger, edges, "hub", "hub-2026/task", (slot, ws) =>
      Effect.gen(function*() {
        const args = { task: true, nonce: randomUUID() }
        const created = yield* modernPost(ws, t, { jsonrpc: "2.0", id: 1, method: "tools/call", params: { name: of.tool, arguments: args, _meta: modernMeta(true) } })
        const createdResult = created["result"] as Json | undefined
        // The hub may answer at once instead (the extension allows it; past the per-user bound it does).
        if (createdResult?.["resultType"] !== "task") return echoed(created, args)
        const taskId = createdResult["taskId"]
        if (typeof taskId !== "string") return failed(`a task without an id: ${JSON.stringify(created)}`)
        // Polled on the other edges in turn: the task is in KV, not at the edge that made it.
        for (let i = 1; ; i++) {
          const at = edges.at((slot + i) % edges.count) ?? ws
          const got = yield* modernPost(at, t, { jsonrpc: "2.0", id: 2, method: "tasks/get", params: { taskId, _meta: modernMeta(true) } })
          const status = (got["result"] as Json | undefined)?.["status"]
          if (status === "completed") return echoed({ result: (got["result"] as Json)["result"] as Json }, args)
          if (status !== "working") return failed(`task ${taskId}: ${JSON.stringify(got)}`)
          yield* Effect.sleep("100 millis")
        }
      }))
    return [call, listen, task] as const
  })
