/**
 * The `tools/call`s of one `/hub` session: each goes to the best tab's socket under an id of its
 * own, waits for the tab's answer (with progress before it), told by the tab's actor
 * (`Registry.FromTab`), is retried when its tab closes, opens a tab for a cached tool that has none, and times
 * out. The session (`HubSession.ts`) decodes requests and hands the calls here; the calls answer
 * on the exchange each came in on. Their timers live in the session actor's scope.
 */
import { type Actors, Bus, InternalClient, Subjects, TimedMap } from "@switchboard/bus"
import { JsonRpc, Registry } from "@switchboard/protocol"
import { failure, notification, request } from "@switchboard/protocol/JsonRpc"
import { Telemetry } from "@switchboard/telemetry"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Scope from "effect/Scope"
import type * as Tracer from "effect/Tracer"
import * as CallOutcome from "./CallOutcome.ts"
import type * as HubTransport from "./HubTransport.ts"
import * as Naming from "./Naming.ts"
import type * as Replica from "./Replica.ts"
import type * as Views from "./Views.ts"

const { ErrorCode } = JsonRpc
const { Method, TabNotFound } = Registry
const isRecord = JsonRpc.isRecord

/** The tab an attempt went to: what routes its answer, and what a hand-off carries. */
type TabRef = Pick<Registry.TabRecord, "conn" | "edge" | "domain" | "tabId">

interface Call {
  readonly id: JsonRpc.Id
  readonly key: string
  /** The tool's name as the client called it, and the tab's tool it stands for. */
  readonly name: string
  readonly target: Naming.Target
  readonly args: Record<string, unknown>
  readonly progressToken: string | number | undefined
  readonly span: Tracer.Span | undefined
  /** Where its answer, and its progress before that, go. */
  readonly exchange: HubTransport.Exchange
  /** Tabs it was sent to so far. */
  attempts: number
  /** Whether a tab was opened for it already (a cached tool with no tab). */
  opened: boolean
  phase: "sent" | "opening" | "backoff"
  /** The id of the attempt in flight, and the tab it went to. */
  mapped: string | undefined
  tab: TabRef | undefined
  /** While it waits for a tab to open, or to be retried; an attempt in flight times out in `byMapped`. */
  timer: ReturnType<typeof setTimeout> | undefined
}

/** What the calls need of the session they belong to. */
export interface Session {
  /** Its tabs' answers come back to this id's actor: a call's id at the tab begins with it. */
  readonly conn: { readonly id: Subjects.ConnId }
  /** The session user's view; none until it authenticated. */
  readonly view: () => Views.View | undefined
  readonly user: () => string | undefined
  readonly runFork: <A, E>(effect: Effect.Effect<A, E>) => unknown
  /** What a successful answer carries beside the tab's result (MCP 2026-07-28's `resultType`); none in the legacy era. */
  readonly complete?: ((value: Record<string, unknown>) => Record<string, unknown>) | undefined
}

/** A call's key among a session's calls: its JSON-RPC id, as the client that sent it knows it. */
export const keyOf = (id: JsonRpc.Id) => `${typeof id}:${id}`
const traceOf = (span: Tracer.AnySpan | undefined) => (span === undefined ? undefined : Telemetry.traceHeaders(span).traceparent)

export interface ToolCalls {
  /**
   * A decoded `tools/call`: answered at once when it cannot go anywhere, or sent to a tab. Its key
   * is its id's (`keyOf`) unless given: requests that share no session may share ids.
   */
  readonly start: (request: JsonRpc.Request, params: Registry.ToolsCallParams, ex: HubTransport.Exchange, span: Tracer.Span | undefined, key?: string) => void
  /** The client cancelled the call with this key: it gets no answer, and its tab is told; false when no such call is in flight. */
  readonly cancel: (key: string, reason: string | undefined) => boolean
  /** What a tab's actor passed on: an answer or progress of a call. */
  readonly fromTab: (from: Registry.FromTab) => Effect.Effect<void> | void
  /** The user's tabs changed: calls waiting for a tab go out, and those whose tab closed are retried. */
  readonly tabsChanged: () => void
  /** The session moves to another replica: its calls in flight, for the adopter's `resume`. */
  readonly handOff: () => Pick<Registry.HubHandoff, "seq" | "calls">
  /** On the adopter: the calls `handedOver` carries; how many were taken on. */
  readonly resume: (handedOver: Registry.HubHandoff, transport: HubTransport.HubTransport) => number
  /** The session closed: its calls end without answers. */
  readonly closed: () => void
}

export const make = (replica: Replica.Replica, session: Session): Effect.Effect<ToolCalls, never, Scope.Scope> =>
  Effect.gen(function*() {
    const { bus, config, inFlight, link, toolCall } = replica
    const { conn } = session
    const callTimeoutMillis = Duration.toMillis(config.callTimeout)
    const tabWaitMillis = Duration.toMillis(config.tabWait)
    const backoffMillis = Duration.toMillis(config.retryBackoff)

    const calls = new Map<string, Call>()
    /** Attempts in flight by mapped id; an attempt's tab gets `notifications/cancelled` once it times out. */
    // In the actor's scope: once the session is handed over or its replica stops, a call that
    // expires here would answer a client the new owner answers, or no one.
    const byMapped = yield* TimedMap.make<string, Call>(callTimeoutMillis, (mapped, call) => {
      const tab = call.tab
      if (tab === undefined) return
      socketOf(tab).send(notification("notifications/cancelled", { requestId: mapped, reason: "timed out" }))
      fail(call, ErrorCode.InternalError, `Tool call timed out after ${Duration.format(config.callTimeout)} in tab ${tab.tabId} of ${tab.domain}`, "timeout")
    }, inFlight)
    let seq = 0
    const stopTimers = () => {
      for (const call of calls.values()) {
        if (call.timer !== undefined) clearTimeout(call.timer)
        call.timer = undefined
      }
    }
    // A call's own timers (waiting for a tab, a retry's pause) end with the actor too, for any
    // reason. An actor that ends interrupted was neither closed nor handed over: its replica
    // stopped with no other to take the session. Its calls get an error now rather than silence.
    // Scope.addFinalizerExit, not Effect.addFinalizer: that one keeps a copy of this fiber's refs.
    yield* Scope.addFinalizerExit(yield* Effect.scope, (exit) =>
      Effect.sync(() => {
        stopTimers()
        if (Exit.isSuccess(exit)) return
        for (const call of [...calls.values()]) fail(call, ErrorCode.ServerError, "The registry replica serving this session stopped; call the tool again")
      })
    )

    const done = (call: Call) => {
      if (call.timer !== undefined) clearTimeout(call.timer)
      calls.delete(call.key)
      if (call.mapped !== undefined) byMapped.delete(call.mapped)
    }
    const fail = (call: Call, code: number, message: string, outcome = CallOutcome.ofFailure(code)) => {
      done(call)
      toolCall(outcome)
      call.exchange.reply(failure(call.id, code, message), traceOf(call.span))
    }

    const sockets = new Map<string, Actors.Socket>()
    const socketOf = (tab: TabRef) => {
      let s = sockets.get(tab.conn)
      if (s === undefined) {
        if (sockets.size > 1_000) sockets.clear()
        sockets.set(tab.conn, (s = link.to(Subjects.EdgeId(tab.edge), Subjects.ConnId(tab.conn))))
      }
      return s
    }

    const dispatch = (call: Call) => {
      const { domain, tool } = call.target
      const tab = Naming.pickTab(session.view()?.tabs().get(domain), call.target)
      if (tab !== undefined) return sendTo(call, tab)
      const cached = session.view()?.cached(domain, tool)
      const user = session.user()
      if (cached !== undefined && !call.opened && user !== undefined) return openTab(call, cached, user)
      if (call.phase === "opening") return // still waiting for the tab it opened
      fail(call, TabNotFound, `TabNotFound: no open tab of ${domain} has the tool ${tool}`)
    }

    const sendTo = (call: Call, tab: Registry.TabRecord) => {
      if (call.timer !== undefined) clearTimeout(call.timer)
      call.timer = undefined
      if (call.mapped !== undefined) byMapped.delete(call.mapped)
      const mapped = `${conn.id}:${++seq}`
      call.attempts++
      call.phase = "sent"
      call.mapped = mapped
      call.tab = tab
      byMapped.set(mapped, call)
      call.span?.attribute("mcp.mapped_id", mapped)
      const params: Registry.ExecuteToolParams = {
        toolName: call.target.tool,
        args: call.args,
        ...(call.progressToken === undefined ? {} : { _meta: { progressToken: mapped } })
      }
      socketOf(tab).send(request(mapped, Method.executeTool, params), traceOf(call.span))
    }

    const openTab = (call: Call, cached: Registry.CachedToolRecord, owner: string) => {
      call.opened = true
      call.phase = "opening"
      const { domain, tool } = call.target
      const url = cached.url
      awaitTab(call, url)
      session.runFork(
        InternalClient.request(owner, "createTab", { url }).pipe(
          Effect.provideService(Bus.Bus, bus),
          Effect.catchAll((e) =>
            Effect.sync(() => {
              if (calls.get(call.key) === call && call.phase === "opening") {
                fail(call, TabNotFound, `TabNotFound: no open tab of ${domain} has ${tool}, and opening ${url} failed: ${e.message}`)
              }
            })
          )
        )
      )
    }

    /** A call waits this long for the tab it opened at `url` to register its tool. */
    const awaitTab = (call: Call, url: string) => {
      const { domain, tool } = call.target
      if (call.timer !== undefined) clearTimeout(call.timer)
      call.timer = setTimeout(
        () => fail(call, TabNotFound, `TabNotFound: opened ${url}, but no tab of ${domain} registered ${tool} within ${Duration.format(config.tabWait)}`),
        tabWaitMillis
      )
    }

    /** A retry waits before it dispatches again. */
    const backOff = (call: Call) => {
      call.phase = "backoff"
      if (call.timer !== undefined) clearTimeout(call.timer)
      call.timer = setTimeout(() => {
        call.timer = undefined
        dispatch(call)
      }, backoffMillis)
    }

    /** The tab a call went to closed (its entry is gone or belongs to a newer socket). */
    const tabClosed = (call: Call, tab: TabRef) => {
      if (call.mapped !== undefined) byMapped.delete(call.mapped)
      call.mapped = undefined
      if (call.attempts > config.retries) {
        return fail(call, ErrorCode.InternalError, `Tab ${tab.tabId} of ${tab.domain} closed during the call; gave up after ${call.attempts} attempts`)
      }
      backOff(call)
    }

    const start: ToolCalls["start"] = (request, params, ex, span, key = keyOf(request.id)) => {
      const { name } = params
      if (calls.has(key)) return ex.reply(failure(request.id, ErrorCode.InvalidRequest, `Invalid Request: id ${String(request.id)} is already in flight`))
      if (calls.size >= config.maxPending) return ex.reply(failure(request.id, ErrorCode.ServerError, `Too many calls in flight (limit ${config.maxPending})`))
      const listed = session.view()?.aggregate().byName.get(name)
      // A name this user's hub does not list is a bad parameter, as MCP has it (-32602); TabNotFound
      // (-32001) is kept for a tool the hub knows, cached or listed, that no tab can serve now.
      if (listed === undefined) return ex.reply(failure(request.id, ErrorCode.InvalidParams, `Unknown tool: ${name}; tools/list shows what the open tabs offer`))
      span?.attribute("mcp.tool.domain", listed.target.domain)
      const call: Call = {
        id: request.id,
        key,
        name: listed.name,
        target: listed.target,
        args: params.arguments ?? {},
        progressToken: Registry.progressTokenOf(params),
        span,
        exchange: ex,
        attempts: 0,
        opened: false,
        phase: "sent",
        mapped: undefined,
        tab: undefined,
        timer: undefined
      }
      calls.set(key, call)
      dispatch(call)
    }

    const cancel: ToolCalls["cancel"] = (key, reason) => {
      const call = calls.get(key)
      if (call === undefined) return false
      done(call)
      // A cancelled request gets no answer; its HTTP exchange ends without one.
      call.exchange.end()
      if (call.phase === "sent" && call.mapped !== undefined && call.tab !== undefined) {
        socketOf(call.tab).send(notification("notifications/cancelled", { requestId: call.mapped, reason: reason ?? "cancelled by the client" }))
      }
      return true
    }

    const tabsChanged = () => {
      const view = session.view()
      for (const call of [...calls.values()]) {
        if (call.phase === "opening") dispatch(call)
        else if (call.phase === "sent" && call.tab !== undefined) {
          const tab = call.tab
          if (view?.tabs().get(tab.domain)?.get(tab.tabId)?.conn !== tab.conn) tabClosed(call, tab)
        }
      }
    }

    const fromTab = (from: Registry.FromTab): Effect.Effect<void> | void => {
      const m = from.message
      const params = "method" in m && isRecord(m.params) ? m.params : {}
      if ("method" in m && m.method === "notifications/progress") {
        const token = params["progressToken"]
        const call = typeof token === "string" ? byMapped.get(token) : undefined
        if (call === undefined || call.tab?.conn !== from.tab || call.progressToken === undefined) return
        return call.exchange.notify(notification("notifications/progress", { ...params, progressToken: call.progressToken }))
      }
      const answered = "method" in m ? undefined : m
      if ("method" in m && m.method !== "notifications/cancelled") return
      const mapped = answered === undefined ? params["requestId"] : answered.id
      const call = typeof mapped === "string" ? byMapped.get(mapped) : undefined
      // Late (timed out, cancelled), or not from the tab the call went to: dropped.
      if (call === undefined || call.tab?.conn !== from.tab) return
      done(call)
      toolCall(answered === undefined ? "cancelled" : CallOutcome.ofTabAnswer(answered))
      const reason = typeof params["reason"] === "string" ? `: ${params["reason"]}` : ""
      const answer = answered === undefined
        ? failure(call.id, ErrorCode.InternalError, `The tab cancelled the call${reason}`)
        : CallOutcome.answerOf(call.id, answered, session.complete)
      if (call.span === undefined) return call.exchange.reply(answer)
      const user = session.user()
      return Effect.currentSpan.pipe(
        Effect.map((span) => call.exchange.reply(answer, traceOf(span))),
        Effect.withSpan("registry.reply", {
          kind: "server",
          parent: call.span,
          attributes: { "rpc.method": "tools/call", "mcp.tool.name": call.name, "mcp.request.id": String(call.id), "mcp.mapped_id": mapped, "sb.conn": conn.id, "user_id": user ?? "" }
        }),
        Effect.ignore
      )
    }

    /**
     * The session moves to another replica: its calls in flight go with it, and from here on
     * this actor answers none of them (its mailbox is handled up to here, and its timers stop),
     * so each gets one answer, from the new owner. Their attempts' timeouts start again there.
     */
    const handOff = () => {
      const handed: Array<Registry.HubHandoff["calls"][number]> = []
      for (const call of calls.values()) {
        const ref = call.exchange.ref
        // An answer with nowhere to go (an HTTP request that named no exchange) goes nowhere there either.
        if (ref === undefined) continue
        handed.push({
          id: call.id,
          name: call.name,
          target: call.target,
          args: call.args,
          ...(call.progressToken === undefined ? {} : { progressToken: call.progressToken }),
          exchange: ref,
          attempts: call.attempts,
          opened: call.opened,
          phase: call.phase,
          ...(call.mapped === undefined ? {} : { mapped: call.mapped }),
          ...(call.tab === undefined ? {} : { tab: { conn: call.tab.conn, edge: call.tab.edge, domain: call.tab.domain, tabId: call.tab.tabId } })
        })
      }
      stopTimers()
      byMapped.clear()
      return { seq, calls: handed }
    }

    // Calls in flight at the replica that handed this session over: their tabs answer here.
    const resume = (handed: Registry.HubHandoff, transport: HubTransport.HubTransport) => {
      seq = Math.max(seq, handed.seq)
      for (const c of handed.calls) {
        const key = keyOf(c.id)
        if (calls.has(key)) continue
        const call: Call = {
          id: c.id,
          key,
          name: c.name,
          target: c.target,
          args: c.args,
          progressToken: c.progressToken,
          span: undefined,
          exchange: transport.resume(c.exchange),
          attempts: c.attempts,
          opened: c.opened,
          phase: c.phase,
          mapped: c.mapped,
          tab: c.tab,
          timer: undefined
        }
        calls.set(key, call)
        if (call.phase === "backoff") backOff(call)
        else if (call.phase === "opening") awaitTab(call, session.view()?.cached(call.target.domain, call.target.tool)?.url ?? call.target.domain)
        else if (call.mapped !== undefined) byMapped.set(call.mapped, call)
        else dispatch(call)
      }
      return calls.size
    }

    const closed = () => {
      for (const call of calls.values()) if (call.timer !== undefined) clearTimeout(call.timer)
      calls.clear()
      byMapped.clear()
    }

    return { start, cancel, fromTab, tabsChanged, handOff, resume, closed } satisfies ToolCalls
  })
