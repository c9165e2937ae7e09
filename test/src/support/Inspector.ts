/**
 * Reads another Node process's heap through its inspector (`node --inspect=127.0.0.1:0`), so a
 * soak test can measure the real server process, not the test's own. The heap is read after a
 * full garbage collection, since used heap without one mostly measures when V8 last collected.
 */
import * as Effect from "effect/Effect"
import { writeFile } from "node:fs/promises"
import { WebSocket } from "ws"
import type { ServiceProcess } from "./Processes.ts"

const LISTENING = /Debugger listening on (ws:\/\/\S+)/

export interface Inspector {
  /** Bytes of heap in use after two full collections. */
  readonly heapAfterGc: Effect.Effect<number>
  /** Writes a heap snapshot to `path`, for a leak hunt: load two of them in DevTools and compare. */
  readonly heapSnapshot: (path: string) => Effect.Effect<void>
}

/** Connects to the inspector `proc` announced on stderr; closed with the scope. */
export const attach = (proc: ServiceProcess) =>
  Effect.gen(function*() {
    const url = LISTENING.exec(proc.output())?.[1]
    if (url === undefined) return yield* Effect.dieMessage(`${proc.service} was not started with --inspect:\n${proc.output()}`)
    const ws = yield* Effect.acquireRelease(
      Effect.async<WebSocket, Error>((resume) => {
        const ws = new WebSocket(url)
        ws.once("open", () => resume(Effect.succeed(ws)))
        ws.once("error", (e) => resume(Effect.fail(e)))
      }),
      (ws) => Effect.sync(() => ws.close())
    ).pipe(Effect.orDie)
    let nextId = 1
    const waiting = new Map<number, (answer: { result?: unknown; error?: { message: string } }) => void>()
    let chunks: Array<string> = []
    ws.on("message", (data) => {
      const m = JSON.parse(data.toString()) as { id?: number; method?: string; params?: { chunk?: string }; result?: unknown; error?: { message: string } }
      if (m.id !== undefined) waiting.get(m.id)?.(m)
      else if (m.method === "HeapProfiler.addHeapSnapshotChunk") chunks.push(m.params?.chunk ?? "")
    })
    const call = (method: string, params: object = {}) =>
      Effect.async<unknown, Error>((resume) => {
        const id = nextId++
        waiting.set(id, (answer) => {
          waiting.delete(id)
          resume(answer.error === undefined ? Effect.succeed(answer.result) : Effect.fail(new Error(`${method}: ${answer.error.message}`)))
        })
        ws.send(JSON.stringify({ id, method, params }))
      }).pipe(Effect.timeoutFail({ duration: "30 seconds", onTimeout: () => new Error(`${method}: no answer within 30s`) }), Effect.orDie)

    const heapAfterGc = Effect.gen(function*() {
      yield* call("HeapProfiler.collectGarbage")
      yield* call("HeapProfiler.collectGarbage")
      const evaluated = (yield* call("Runtime.evaluate", { expression: "process.memoryUsage().heapUsed", returnByValue: true })) as {
        readonly result: { readonly value: number }
      }
      return evaluated.result.value
    })
    const heapSnapshot = (path: string) =>
      Effect.gen(function*() {
        chunks = []
        yield* call("HeapProfiler.takeHeapSnapshot", { reportProgress: false })
        const text = chunks.join("")
        chunks = []
        yield* Effect.promise(() => writeFile(path, text))
      })
    return { heapAfterGc, heapSnapshot } satisfies Inspector
  })
