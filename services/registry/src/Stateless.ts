/**
 * MCP 2026-07-28 at `/hub`: requests that need no session (DESIGN.md, "Requests that need no
 * session"). The edge has checked a request (token, Origin, headers against body, version) and
 * sends it to the registry's queue group, so any replica answers any request, on the edge's
 * exchange the request names. Per user, a replica keeps what answering needs warm for a while
 * after the user's last request (`REGISTRY_STATELESS_IDLE`): the user's view, followed from KV on
 * first use, and the user's calls, whose tabs answer on a subject of their own. Nothing is read
 * from KV per request, and nothing outlives the request but that warm endpoint, except a task
 * (`Tasks.ts`): a client that declares the tasks extension gets one for its `tools/call`.
 */
import { type Actors, Bus, Subjects } from "@switchboard/bus"
import { Envelope, JsonRpc, Modern, ParamHeaders, Registry } from "@switchboard/protocol"
import { failure } from "@switchboard/protocol/JsonRpc"
import { Telemetry } from "@switchboard/telemetry"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import * as Scope from "effect/Scope"
import type * as Tracer from "effect/Tracer"
import { randomUUID } from "node:crypto"
import type * as HubTransport from "./HubTransport.ts"
import * as Replica from "./Replica.ts"
import * as Tasks from "./Tasks.ts"
import * as ToolCall from "./ToolCall.ts"
import * as ToolsPage from "./ToolsPage.ts"
import type * as Views from "./Views.ts"

const { ErrorCode } = JsonRpc

/** What a `tools/list` answer carries beyond its page, in this era: the list is the user's own. */
const LIST_EXTRA = `,"ttlMs":${Modern.ToolsListTtlMillis},"cacheScope":"private","resultType":"complete","_meta":${
  JSON.stringify({ [Modern.Meta.serverInfo]: Modern.ServerInfo })
}`

/** A user's warm state on this replica: the calls of every modern request of theirs that it took. */
class Endpoint implements ToolCall.Session, Views.Listener {
  readonly conn: { readonly id: Subjects.ConnId }
  calls: ToolCall.ToolCalls | undefined
  readonly complete = Modern.complete

  constructor(
    private readonly replica: Replica.Replica,
    private readonly owner: string,
    private readonly currentView: Views.View
  ) {
    this.conn = { id: Subjects.ConnId(randomUUID()) }
  }
  view() {
    return this.currentView
  }
  user() {
    return this.owner
  }
  runFork<A, E>(effect: Effect.Effect<A, E>) {
    this.replica.runService(effect)
  }
  /** A call whose tab closed is retried, and one waiting for a tab goes out. */
  changed() {
    this.calls?.tabsChanged()
  }
}

/** The connection id on an answer that no endpoint sends: an edge only reads the exchange. */
const NO_ENDPOINT = "00000000-0000-0000-0000-000000000000"

/** How long a client's cancellation is remembered for a request that has not reached its endpoint yet. */
const EARLY_CANCEL_MILLIS = 60_000

/**
 * A user's endpoint on this replica: made on the user's first request (their view is read from
 * KV then), kept while requests use it and for `REGISTRY_STATELESS_IDLE` after the last, then
 * let go. Requests that arrive while it is made wait for it.
 */
interface Slot {
  endpoint: Endpoint | undefined
  readonly waiting: Array<(endpoint: Endpoint | undefined) => void>
  readonly scope: Scope.CloseableScope
  /** Requests it serves now; it is let go only at none. */
  active: number
  usedAt: number
}

/** The actor host's `inbox`: a tab's actor on this replica then tells an endpoint without the bus. */
export type LocalInbox = (id: Subjects.ConnId, inbox: Actors.Inbox) => Effect.Effect<void, never, Scope.Scope>

export const serve = (replica: Replica.Replica, local: LocalInbox) =>
  Effect.gen(function*() {
    const { bus, link } = replica
    const idleMillis = Duration.toMillis(replica.config.statelessIdle)
    const slots = new Map<string, Slot>()

    /** The user's endpoint, built in `scope`: their view, their calls, and the subject their tabs answer on. */
    const build = (user: string, scope: Scope.Scope) =>
      Effect.gen(function*() {
        const endpoint = new Endpoint(replica, user, yield* replica.views.acquire(user))
        endpoint.calls = yield* ToolCall.make(replica, endpoint)
        const view = endpoint.view()
        view.listen(endpoint)
        yield* Effect.addFinalizer(() => Effect.sync(() => view.unlisten(endpoint)))
        // Tabs answer the calls here: a call's id at its tab begins with this endpoint's id.
        const inbox = Replica.peers.inbox(bus, (message) => (message._tag === "FromTab" ? endpoint.calls?.fromTab(message) : undefined))
        const offer = (m: Bus.BusMessage) => {
          const effect = inbox(m)
          if (effect !== undefined) replica.runService(effect)
        }
        // From a tab's actor on this replica, as it is (no encoding, no bus); from others, over the bus.
        yield* local(endpoint.conn.id, { offer })
        yield* bus.subscribe(Subjects.conn("registry", endpoint.conn.id), offer)
        return endpoint
      }).pipe(Scope.extend(scope))

    /** Calls `then` with the user's endpoint, at once when it is warm; undefined when it could not be made. */
    const withEndpoint = (user: string, then: (slot: Slot, endpoint: Endpoint | undefined) => void) => {
      const warm = slots.get(user)
      if (warm !== undefined) {
        if (warm.endpoint !== undefined) return then(warm, warm.endpoint)
        return void warm.waiting.push((endpoint) => then(warm, endpoint))
      }
      const scope = Effect.runSync(Scope.make())
      const slot: Slot = { endpoint: undefined, waiting: [(endpoint) => then(slot, endpoint)], scope, active: 0, usedAt: Date.now() }
      slots.set(user, slot)
      replica.runService(
        build(user, scope).pipe(
          Effect.matchCauseEffect({
            onSuccess: (endpoint) => Effect.sync(() => (slot.endpoint = endpoint)),
            onFailure: (cause) =>
              Effect.zipRight(
                Effect.sync(() => slots.get(user) === slot && slots.delete(user)),
                Effect.zipRight(Scope.close(scope, Exit.void), Effect.logWarning(`registry: could not serve ${user}'s requests`, cause))
              )
          }),
          Effect.ensuring(Effect.sync(() => {
            for (const waiter of slot.waiting.splice(0)) waiter(slot.endpoint)
          }))
        )
      )
    }

    const sweep = setInterval(() => {
      const now = Date.now()
      for (const [key, at] of early) if (now - at >= EARLY_CANCEL_MILLIS) early.delete(key)
      for (const [user, slot] of slots) {
        if (slot.endpoint === undefined || slot.active > 0 || now - slot.usedAt < idleMillis) continue
        slots.delete(user)
        replica.runService(Scope.close(slot.scope, Exit.void))
      }
    }, Math.min(EARLY_CANCEL_MILLIS, Math.max(1_000, idleMillis / 4)))
    sweep.unref()
    yield* Effect.addFinalizer(() =>
      Effect.suspend(() => {
        clearInterval(sweep)
        // Not a success: the calls still in flight are answered that this replica stopped (`ToolCall`).
        const closing = [...slots.values()].map((slot) => Scope.close(slot.scope, Exit.interrupt(FiberId.none)))
        slots.clear()
        return Effect.all(closing, { discard: true })
      })
    )

    /** A task's call, on this replica: it holds the user's endpoint until it answers into the task. */
    const runTask: Tasks.Run = (user, task) =>
      withEndpoint(user, (slot, endpoint) => {
        const params: Registry.ToolsCallParams = { name: task.call.name, ...(task.call.arguments === undefined ? {} : { arguments: task.call.arguments }) }
        if (endpoint === undefined) {
          return tasks.exchange(user, task.taskId, () => {}).reply(failure(task.taskId, ErrorCode.ServerError, "the registry could not read this user's tools"))
        }
        slot.active++
        const ex = tasks.exchange(user, task.taskId, () => {
          slot.active--
          slot.usedAt = Date.now()
        })
        endpoint.calls?.start({ id: task.taskId, method: "tools/call", params }, params, ex, undefined, Tasks.callKey(task.taskId))
      })
    // After the endpoints: a stopping replica lets its tasks go before their calls end.
    const tasks = yield* Tasks.make(replica, runTask)

    /**
     * Cancellations that came before their request reached its endpoint (the first request of a
     * user waits for the view): the call is dropped when it starts.
     */
    const early = new Map<string, number>()
    const cancelled = (key: string) => {
      const at = early.get(key)
      if (at === undefined) return false
      early.delete(key)
      return Date.now() - at < EARLY_CANCEL_MILLIS
    }

    const onRequest = (m: Bus.BusMessage) => {
      // Only the edge sends here, and it always names who asks and where the answer goes.
      const envelope = Envelope.decodeStateless(m)
      if (Either.isLeft(envelope)) return
      const { user, edge, http: exchange, params: mcpParams, traceparent } = envelope.right
      const decoded = JsonRpc.decodeFrame(Bus.text(m))
      if (Either.isLeft(decoded) || decoded.right._tag !== "Request") return
      const request = decoded.right.message
      withEndpoint(user, (slot, endpoint) => {
        if (endpoint === undefined) {
          const out = link.exchange(Subjects.EdgeId(edge), Subjects.ConnId(NO_ENDPOINT), exchange)
          return out.send(failure(request.id, ErrorCode.ServerError, "the registry could not read this user's tools; try again"), { end: true })
        }
        slot.active++
        const ex = exchangeOn(endpoint, Subjects.EdgeId(edge), exchange, () => {
          slot.active--
          slot.usedAt = Date.now()
        })
        const key = `${edge}/${exchange}`
        if (cancelled(key)) return ex.end()
        answer(endpoint, request, ex, key, traceparent, mcpParams)
      })
    }

    /**
     * Where a request's answer goes: the edge's exchange; the endpoint is let go with the answer.
     * A refusal is an answer with an HTTP status of its own.
     */
    const exchangeOn = (
      endpoint: Endpoint,
      edge: Subjects.EdgeId,
      exchange: string,
      release: () => void
    ): HubTransport.Exchange & { readonly refuse: (data: string, status: number) => void } => {
      const out = link.exchange(edge, endpoint.conn.id, exchange)
      let open = true
      const last = () => {
        if (!open) return false
        open = false
        release()
        return true
      }
      return {
        reply: (data, traceparent) => {
          if (last()) out.send(data, traceparent === undefined ? { end: true } : { end: true, traceparent })
        },
        notify: (data) => {
          if (open) out.send(data)
        },
        end: () => {
          if (last()) out.send("", { end: true })
        },
        refuse: (data, status) => {
          if (last()) out.send(data, { end: true, status })
        },
        // A request belongs to no session that could move: nothing to hand over.
        ref: undefined
      }
    }

    const answer = (
      endpoint: Endpoint,
      request: JsonRpc.Request,
      ex: ReturnType<typeof exchangeOn>,
      key: string,
      traceparent: string | undefined,
      mcpParams: string | undefined
    ) => {
      switch (request.method) {
        case "tools/list": {
          const fields = ToolsPage.page(endpoint.view().aggregate(), request.params, replica.config)
          if (fields === undefined) return ex.reply(failure(request.id, ErrorCode.InvalidParams, "Invalid params: unknown cursor"))
          return ex.reply(ToolsPage.answer(request.id, fields, LIST_EXTRA))
        }
        case "tools/call": {
          const params = Registry.decodeToolsCallParams(request.params)
          if (Either.isLeft(params)) return ex.reply(failure(request.id, ErrorCode.InvalidParams, "Invalid params: tools/call expects {name: string, arguments?: object}"))
          // MCP 2026-07-28's Server Validation: the Mcp-Param-* headers the tool's x-mcp-header
          // asks for must say what the body does, or a proxy routed on a value the tab never gets.
          const listed = endpoint.view().aggregate().byName.get(params.right.name)
          const mismatch = listed === undefined
            ? undefined
            : ParamHeaders.mismatch(ParamHeaders.of(listed.tool.inputSchema), params.right.arguments, ParamHeaders.decodeReceived(mcpParams))
          if (mismatch !== undefined) return ex.refuse(failure(request.id, Modern.ErrorCode.HeaderMismatch, mismatch), 400)
          // A client that takes a task gets one for any tool it may call (tools/list lists it):
          // its call may wait for a tab to open or retry for many seconds, and no HTTP stream
          // has to stay open meanwhile. An unknown tool is answered at once, as without tasks.
          if (Modern.declaresTasks(request) && endpoint.view().aggregate().byName.has(params.right.name)) {
            return replica.runService(
              Effect.map(tasks.create(endpoint.user(), request, params.right, ex), (created) => (created ? undefined : call(endpoint, request, params.right, ex, key, traceparent)))
            )
          }
          return call(endpoint, request, params.right, ex, key, traceparent)
        }
        case "tasks/get":
        case "tasks/update":
        case "tasks/cancel":
          return replica.runService(tasks.handle(endpoint.user(), request, ex))
        default:
          // The edge sends only the methods this era serves here; this is the replica's own check.
          return ex.reply(failure(request.id, ErrorCode.MethodNotFound, `Method not found: ${request.method}`))
      }
    }

    /** A `tools/call` answered on its request's exchange. */
    const call = (endpoint: Endpoint, request: JsonRpc.Request, params: Registry.ToolsCallParams, ex: HubTransport.Exchange, key: string, traceparent: string | undefined) => {
      const start = (span: Tracer.Span | undefined) => endpoint.calls?.start(request, params, ex, span, key)
      if (!replica.traced) return start(undefined)
      return replica.runService(
        Effect.currentSpan.pipe(
          Effect.map(start),
          Effect.withSpan("registry.call", {
            kind: "server",
            attributes: {
              "rpc.method": "tools/call",
              "mcp.tool.name": params.name,
              "mcp.request.id": String(request.id),
              "mcp.protocol.version": Modern.Versions[0],
              "user_id": endpoint.user()
            }
          }),
          Telemetry.withRemoteParent(traceparent),
          Effect.ignore
        )
      )
    }

    const onCancelled = (m: Bus.BusMessage) => {
      const envelope = Envelope.decodeStateless(m)
      if (Either.isLeft(envelope)) return
      const { user, edge, http } = envelope.right
      const key = `${edge}/${http}`
      const endpoint = slots.get(user)?.endpoint
      if (endpoint?.calls?.cancel(key, "the client closed the request's stream") === true) return
      if (early.size >= 10_000) early.clear()
      early.set(key, Date.now())
    }

    /** `tasks/cancel` on any replica: the call stops here if its task runs here. */
    const onTaskCancelled = (m: Bus.BusMessage) => {
      const user = m.header(Subjects.Header.user)
      const taskId = m.header(Subjects.Header.task)
      if (user === undefined || taskId === undefined) return
      slots.get(user)?.endpoint?.calls?.cancel(Tasks.callKey(taskId), "the client cancelled the task")
    }

    yield* bus.subscribe(Subjects.stateless("registry"), onRequest, { queue: Subjects.Queue.service("registry") })
    yield* bus.subscribe(Subjects.statelessCancelled("registry"), onCancelled)
    yield* bus.subscribe(Subjects.taskCancelled("registry"), onTaskCancelled)
  })
