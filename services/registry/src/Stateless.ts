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
import { Bus, Subjects } from "@switchboard/bus"
import { JsonRpc, Modern, Registry } from "@switchboard/protocol"
import { Telemetry } from "@switchboard/telemetry"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as RcMap from "effect/RcMap"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import type * as Tracer from "effect/Tracer"
import { randomUUID } from "node:crypto"
import type * as HubTransport from "./HubTransport.ts"
import { failure } from "./Replies.ts"
import * as Replica from "./Replica.ts"
import * as Tasks from "./Tasks.ts"
import * as ToolCall from "./ToolCall.ts"
import * as ToolsPage from "./ToolsPage.ts"
import type * as Views from "./Views.ts"

const { ErrorCode } = JsonRpc
const decodeCallParams = Schema.decodeUnknownEither(Registry.ToolsCallParams)

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

/** How long a client's cancellation is remembered for a request that has not reached its endpoint yet. */
const EARLY_CANCEL_MILLIS = 60_000

export const serve = (replica: Replica.Replica) =>
  Effect.gen(function*() {
    const { bus, link } = replica
    const live = new Map<string, Endpoint>()

    const endpoints = yield* RcMap.make({
      lookup: (user: string) =>
        Effect.gen(function*() {
          const endpoint = new Endpoint(replica, user, yield* replica.views.acquire(user))
          endpoint.calls = yield* ToolCall.make(replica, endpoint)
          const view = endpoint.view()
          view.listen(endpoint)
          live.set(user, endpoint)
          yield* Effect.addFinalizer(() =>
            Effect.sync(() => {
              view.unlisten(endpoint)
              if (live.get(user) === endpoint) live.delete(user)
            })
          )
          // Tabs answer the calls here: a call's id at its tab begins with this endpoint's id.
          const inbox = Replica.peers.inbox(bus, (message) => (message._tag === "FromTab" ? endpoint.calls?.fromTab(message) : undefined))
          yield* bus.subscribe(Subjects.conn("registry", endpoint.conn.id), (m) => {
            const effect = inbox(m)
            if (effect !== undefined) replica.runService(effect)
          })
          return endpoint
        }).pipe(Effect.orDie),
      idleTimeToLive: replica.config.statelessIdle
    })

    /** A task's call, on this replica: it holds the user's endpoint until it answers into the task. */
    const runTask: Tasks.Run = (user, task) =>
      replica.runService(
        Effect.gen(function*() {
          const scope = yield* Scope.make()
          const endpoint = yield* Scope.extend(RcMap.get(endpoints, user), scope)
          const release = () => void replica.runService(Scope.close(scope, Exit.void))
          const params: Registry.ToolsCallParams = { name: task.call.name, ...(task.call.arguments === undefined ? {} : { arguments: task.call.arguments }) }
          const ex = tasks.exchange(user, task.taskId, release)
          endpoint.calls?.start({ id: task.taskId, method: "tools/call", params }, params, ex, undefined, Tasks.callKey(task.taskId))
        })
      )
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
      const user = m.header(Subjects.Header.user)
      const edge = m.header(Subjects.Header.edge)
      const exchange = m.header(Subjects.Header.http)
      // Only the edge sends here, and it always names all three.
      if (user === undefined || edge === undefined || exchange === undefined) return
      const decoded = JsonRpc.decodeFrame(Bus.text(m))
      if (Either.isLeft(decoded) || decoded.right._tag !== "Request") return
      const request = decoded.right.message
      replica.runService(
        Effect.gen(function*() {
          const scope = yield* Scope.make()
          const endpoint = yield* Scope.extend(RcMap.get(endpoints, user), scope)
          const release = () => void replica.runService(Scope.close(scope, Exit.void))
          const ex = exchangeOn(endpoint, Subjects.EdgeId(edge), exchange, release)
          const key = `${edge}/${exchange}`
          if (cancelled(key)) return ex.end()
          answer(endpoint, request, ex, key, m.header(Subjects.Header.traceparent))
        })
      )
    }

    /** Where a request's answer goes: the edge's exchange; the endpoint is let go with the answer. */
    const exchangeOn = (endpoint: Endpoint, edge: Subjects.EdgeId, exchange: string, release: () => void): HubTransport.Exchange => {
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
        // A request belongs to no session that could move: nothing to hand over.
        ref: undefined
      }
    }

    const answer = (endpoint: Endpoint, request: JsonRpc.Request, ex: HubTransport.Exchange, key: string, traceparent: string | undefined) => {
      switch (request.method) {
        case "tools/list": {
          const fields = ToolsPage.page(endpoint.view().aggregate(), request.params, replica.config)
          if (fields === undefined) return ex.reply(failure(request.id, ErrorCode.InvalidParams, "Invalid params: unknown cursor"))
          return ex.reply(ToolsPage.answer(request.id, fields, LIST_EXTRA))
        }
        case "tools/call": {
          const params = decodeCallParams(request.params)
          if (Either.isLeft(params)) return ex.reply(failure(request.id, ErrorCode.InvalidParams, "Invalid params: tools/call expects {name: string, arguments?: object}"))
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
      const user = m.header(Subjects.Header.user)
      const key = `${m.header(Subjects.Header.edge)}/${m.header(Subjects.Header.http)}`
      const endpoint = user === undefined ? undefined : live.get(user)
      if (endpoint?.calls?.cancel(key, "the client closed the request's stream") === true) return
      if (early.size >= 10_000) early.clear()
      early.set(key, Date.now())
    }

    const sweep = setInterval(() => {
      const now = Date.now()
      for (const [key, at] of early) if (now - at >= EARLY_CANCEL_MILLIS) early.delete(key)
    }, EARLY_CANCEL_MILLIS)
    sweep.unref()
    yield* Effect.addFinalizer(() => Effect.sync(() => clearInterval(sweep)))

    /** `tasks/cancel` on any replica: the call stops here if its task runs here. */
    const onTaskCancelled = (m: Bus.BusMessage) => {
      const user = m.header(Subjects.Header.user)
      const taskId = m.header(Subjects.Header.task)
      if (user === undefined || taskId === undefined) return
      live.get(user)?.calls?.cancel(Tasks.callKey(taskId), "the client cancelled the task")
    }

    yield* bus.subscribe(Subjects.stateless("registry"), onRequest, { queue: Subjects.Queue.service("registry") })
    yield* bus.subscribe(Subjects.statelessCancelled("registry"), onCancelled)
    yield* bus.subscribe(Subjects.taskCancelled("registry"), onTaskCancelled)
  })
