/**
 * MCP 2026-07-28 tasks (the `io.modelcontextprotocol/tasks` extension) for `tools/call` at `/hub`.
 * A task's state and result live in the tasks bucket (replicated JetStream KV) under its owner, so
 * any replica answers `tasks/get` and `tasks/cancel` from any edge, and a task outlives the edge
 * that started it and the replica that ran it: a `tasks/get` that finds a working task whose
 * runner is gone (stopped, or its liveness key lapsed) claims it and sends its call again.
 */
import { Kv, Subjects } from "@switchboard/bus"
import { JsonRpc, Modern, Registry } from "@switchboard/protocol"
import { failure, result } from "@switchboard/protocol/JsonRpc"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { randomUUID } from "node:crypto"
import type * as HubTransport from "./HubTransport.ts"
import type * as Replica from "./Replica.ts"

const { ErrorCode } = JsonRpc
const decodeTaskParams = Schema.decodeUnknownEither(Registry.TaskParams)

/** How often a client should poll (`pollIntervalMs`): a tab's tool answers in seconds, not minutes. */
export const PollIntervalMillis = 1_000

/** A task's call among its user's calls on a replica: apart from requests' `<edge>/<exchange>` keys. */
export const callKey = (taskId: string) => `task:${taskId}`

const TASK_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

/** What the extension's examples say, and a client may show. */
const NOT_FOUND = "Failed to retrieve task: Task not found"

/** A task as the client sees it (`DetailedTask`): ISO times, and its result or error once it has one. */
const detailed = (task: Registry.TaskRecord): Record<string, unknown> => ({
  taskId: task.taskId,
  status: task.status,
  ...(task.statusMessage === undefined ? {} : { statusMessage: task.statusMessage }),
  createdAt: new Date(task.createdAt).toISOString(),
  lastUpdatedAt: new Date(task.lastUpdatedAt).toISOString(),
  ttlMs: task.ttlMs,
  pollIntervalMs: PollIntervalMillis,
  ...(task.status === "completed" && task.result !== undefined ? { result: task.result } : {}),
  ...(task.status === "failed" && task.error !== undefined ? { error: task.error } : {})
})

/** What a call's answer (a JSON-RPC response, as the client would have had it) makes of its task. */
const outcomeOf = (data: string): Pick<Registry.TaskRecord, "status" | "statusMessage" | "result" | "error"> => {
  let parsed: unknown
  try {
    parsed = JSON.parse(data)
  } catch {
    parsed = undefined
  }
  if (JsonRpc.isRecord(parsed) && JsonRpc.isRecord(parsed["result"])) {
    // The task's own result says `resultType`; the inner one is the CallToolResult alone.
    const { resultType: _, ...rest } = parsed["result"]
    return { status: "completed", result: rest }
  }
  const error = JsonRpc.isRecord(parsed) && JsonRpc.isRecord(parsed["error"]) ? parsed["error"] : {}
  const code = typeof error["code"] === "number" && Number.isSafeInteger(error["code"]) ? error["code"] : ErrorCode.InternalError
  const message = typeof error["message"] === "string" ? error["message"] : "the call failed"
  return { status: "failed", statusMessage: `Tool call failed: ${message}`, error: { code, message } }
}

/** Sends a task's call on its way on this replica; its answer comes back on `Tasks.exchange`. */
export type Run = (user: string, task: Registry.TaskRecord) => void

export const make = (replica: Replica.Replica, run: Run) =>
  Effect.gen(function*() {
    const { bus, config } = replica
    const tasks = Kv.typed(yield* replica.kv.bucket({ ...Subjects.Bucket.tasks, ttl: config.taskTtl }), Registry.TaskRecord)
    const replicas = yield* replica.kv.bucket(Subjects.Bucket.replicas)
    const ttlMs = Duration.toMillis(config.taskTtl)
    /** Tasks whose call runs here, by key: what a stopping replica lets go. */
    const running = new Map<string, { readonly user: string; readonly taskId: string }>()
    let stopping = false

    const read = (user: string, taskId: string) =>
      Effect.gen(function*() {
        // Ids are ours (UUIDs): anything else was never a task, and is not looked up at all.
        if (!TASK_ID.test(taskId)) return Option.none()
        const key = Subjects.Key.task(user, taskId)
        const found = yield* tasks.get(key)
        if (Option.isNone(found)) return found
        if (found.value.value.createdAt + found.value.value.ttlMs > Date.now()) return found
        // Past its ttl: gone, whatever the bucket's own age limit still keeps.
        yield* tasks.delete(key).pipe(Effect.ignore)
        return Option.none()
      })

    /** Writes `change` of the task if it is still working and still this replica's; drops it otherwise. */
    const settleOwn = (user: string, taskId: string, change: (task: Registry.TaskRecord) => Registry.TaskRecord) =>
      Effect.gen(function*() {
        const key = Subjects.Key.task(user, taskId)
        for (let attempt = 0; attempt < 5; attempt++) {
          const found = yield* tasks.get(key)
          if (Option.isNone(found)) return
          const { revision, value } = found.value
          // Cancelled meanwhile, or claimed by another replica that thought this one gone.
          if (value.status !== "working" || value.runner !== replica.id) return
          const written = yield* tasks.update(key, change(value), revision).pipe(
            Effect.as(true),
            Effect.catchTag("KvConflict", () => Effect.succeed(false))
          )
          if (written) return
        }
      }).pipe(Effect.catchAll((e) => Effect.logWarning(`could not store the outcome of task ${taskId}`, e)))

    /**
     * A stopping replica lets its tasks go: each loses its runner, so the next `tasks/get` on
     * another replica runs its call again rather than waiting out this replica's liveness key.
     * Registered after the users' endpoints, so it runs before their calls are failed with
     * "replica stopped" (which `stopping` keeps out of the tasks).
     */
    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        stopping = true
        yield* Effect.forEach(
          [...running.values()],
          ({ taskId, user }) =>
            settleOwn(user, taskId, (task) => {
              const { runner: _, ...rest } = task
              return { ...rest, lastUpdatedAt: Date.now(), statusMessage: "The registry replica running the call stopped; the next tasks/get runs it again" }
            }),
          { concurrency: "unbounded", discard: true }
        )
        running.clear()
      })
    )

    /** Where a task's call answers: its record in KV. `release` lets the user's endpoint go. */
    const exchange = (user: string, taskId: string, release: () => void): HubTransport.Exchange => {
      const key = Subjects.Key.task(user, taskId)
      running.set(key, { user, taskId })
      let open = true
      const finish = (data: string | undefined) => {
        if (!open) return
        open = false
        release()
        // Stopping: the finalizer above lets the task go instead of failing it.
        if (stopping) return
        running.delete(key)
        // Ended with no answer: cancelled, and `tasks/cancel` wrote so already.
        if (data === undefined) return
        const outcome = outcomeOf(data)
        replica.runService(settleOwn(user, taskId, (task) => ({ ...task, ...outcome, lastUpdatedAt: Date.now() })))
      }
      return {
        reply: (data) => finish(data),
        // "notifications/progress … are not supported on tasks" (ext-tasks): a task's progress goes nowhere.
        notify: () => undefined,
        end: () => finish(undefined),
        ref: undefined
      }
    }

    /**
     * A `tools/call` of a client that declared the extension: a task, stored before it is
     * answered (a `tasks/get` for it resolves at once on any replica), then its call runs here.
     * False when no task was made (the user has `REGISTRY_MAX_TASKS_PER_USER`, or KV failed): the
     * call is then answered directly, which the extension allows at any time.
     */
    const create = (user: string, request: JsonRpc.Request, params: Registry.ToolsCallParams, ex: HubTransport.Exchange) =>
      Effect.gen(function*() {
        // One request, not a listing: a listing grows with the user's tasks (a consumer, then a get
        // a key once it runs long), and with a thousand tasks for one user it kept a loaded NATS
        // cluster from recovering from a node's restart in the chaos run.
        if ((yield* tasks.count(Subjects.Key.userTasks(user))) >= config.maxTasksPerUser) return false
        const now = Date.now()
        const task: Registry.TaskRecord = {
          taskId: randomUUID(),
          owner: user,
          status: "working",
          createdAt: now,
          lastUpdatedAt: now,
          ttlMs,
          call: { name: params.name, ...(params.arguments === undefined ? {} : { arguments: params.arguments }) },
          runner: replica.id,
          runs: 1
        }
        yield* tasks.create(Subjects.Key.task(user, task.taskId), task)
        ex.reply(result(request.id, { ...detailed(task), resultType: "task", _meta: { [Modern.Meta.serverInfo]: Modern.ServerInfo } }))
        run(user, task)
        return true
      }).pipe(Effect.catchAll((e) => Effect.as(Effect.logWarning("could not create a task; answering the call directly", e), false)))

    /** Whether the replica named `runner` is alive; a KV failure counts as alive, so a call never runs twice for it. */
    const alive = (runner: string | undefined) =>
      runner === undefined
        ? Effect.succeed(false)
        : replicas.get(Subjects.Key.replica("registry", runner)).pipe(Effect.map(Option.isSome), Effect.orElseSucceed(() => true))

    /** A working task whose runner is gone becomes this replica's, and its call goes out again. */
    const adopt = (user: string, task: Registry.TaskRecord, revision: number) =>
      Effect.gen(function*() {
        if (task.status !== "working" || task.runner === replica.id || (yield* alive(task.runner))) return task
        const claimed: Registry.TaskRecord = {
          ...task,
          runner: replica.id,
          runs: task.runs + 1,
          lastUpdatedAt: Date.now(),
          statusMessage: "The registry replica running the call is gone; the call was sent again"
        }
        const won = yield* tasks.update(Subjects.Key.task(user, task.taskId), claimed, revision).pipe(
          Effect.as(true),
          Effect.catchTag("KvConflict", () => Effect.succeed(false))
        )
        // Another replica claimed it first: it runs the call, and this answer says working still.
        if (!won) return task
        run(user, claimed)
        return claimed
      })

    const publishCancelled = (user: string, taskId: string) => {
      try {
        bus.unsafePublish(Subjects.taskCancelled("registry"), "", { [Subjects.Header.user]: user, [Subjects.Header.task]: taskId })
      } catch {
        // The bus is closing: no replica is left to stop the call.
      }
    }

    const cancelStored = (user: string, taskId: string) =>
      Effect.gen(function*() {
        const key = Subjects.Key.task(user, taskId)
        for (let attempt = 0; attempt < 5; attempt++) {
          const found = yield* read(user, taskId)
          if (Option.isNone(found)) return false
          const { revision, value } = found.value
          if (value.status !== "working") return true
          const { runner: _, ...rest } = value
          const cancelled: Registry.TaskRecord = { ...rest, status: "cancelled", statusMessage: "Cancelled by the client", lastUpdatedAt: Date.now() }
          const written = yield* tasks.update(key, cancelled, revision).pipe(Effect.as(true), Effect.catchTag("KvConflict", () => Effect.succeed(false)))
          if (written) return true
        }
        return true
      })

    /** `tasks/get`, `tasks/update` and `tasks/cancel` of `user`: another user's task id is not found. */
    const handle = (user: string, request: JsonRpc.Request, ex: HubTransport.Exchange) =>
      Effect.gen(function*() {
        const params = decodeTaskParams(request.params)
        if (Either.isLeft(params)) return ex.reply(failure(request.id, ErrorCode.InvalidParams, `Invalid params: ${request.method} expects {taskId: string}`))
        const { taskId } = params.right
        const notFound = () => ex.reply(failure(request.id, ErrorCode.InvalidParams, NOT_FOUND))
        switch (request.method) {
          case "tasks/get": {
            const found = yield* read(user, taskId)
            if (Option.isNone(found)) return notFound()
            const task = yield* adopt(user, found.value.value, found.value.revision)
            return ex.reply(result(request.id, Modern.complete(detailed(task))))
          }
          case "tasks/cancel": {
            if (!(yield* cancelStored(user, taskId))) return notFound()
            publishCancelled(user, taskId)
            return ex.reply(result(request.id, Modern.complete({})))
          }
          default: {
            // tasks/update: a tab never asks the client anything, so no input is outstanding,
            // and responses to keys not outstanding are ignored, as the extension asks.
            if (Option.isNone(yield* read(user, taskId))) return notFound()
            return ex.reply(result(request.id, Modern.complete({})))
          }
        }
      }).pipe(
        Effect.catchAll((e) =>
          Effect.zipRight(Effect.logWarning(`${request.method} failed`, e), Effect.sync(() => ex.reply(failure(request.id, ErrorCode.InternalError, "Internal error: the task store did not answer"))))
        )
      )

    return { create, exchange, handle }
  })

export type Tasks = Effect.Effect.Success<ReturnType<typeof make>>
