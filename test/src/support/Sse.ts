/** A Streamable HTTP GET stream read with plain fetch: its SSE events, in order. */
import { expect } from "@effect/vitest"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Queue from "effect/Queue"

/** SSE events of a GET stream opened with plain fetch, into a queue; the stream ends with the scope. */
export const sseStream = (base: string, t: string, session: string, version: string, lastEventId?: string) =>
  Effect.gen(function*() {
    const events = yield* Queue.unbounded<{ readonly id: string | undefined; readonly data: string }>()
    const ended = yield* Deferred.make<void>()
    const abort = new AbortController()
    yield* Effect.addFinalizer(() => Effect.sync(() => abort.abort()))
    const res = yield* Effect.promise(() =>
      fetch(`${base}/hub`, {
        method: "GET",
        signal: abort.signal,
        headers: { authorization: `Bearer ${t}`, accept: "text/event-stream", "mcp-session-id": session, "mcp-protocol-version": version, ...(lastEventId === undefined ? {} : { "last-event-id": lastEventId }) }
      })
    )
    expect(res.status).toBe(200)
    expect(res.headers.get("content-type")).toBe("text/event-stream")
    const body = res.body
    if (body === null) return yield* Effect.dieMessage("no body")
    void (async () => {
      const decoder = new TextDecoder()
      let buffered = ""
      const reader = body.getReader()
      try {
        for (;;) {
          const { done, value } = await reader.read()
          if (done) break
          buffered += decoder.decode(value, { stream: true })
          let at: number
          while ((at = buffered.indexOf("\n\n")) >= 0) {
            const block = buffered.slice(0, at)
            buffered = buffered.slice(at + 2)
            let id: string | undefined
            const data: Array<string> = []
            for (const line of block.split("\n")) {
              if (line.startsWith("id: ")) id = line.slice(4)
              else if (line.startsWith("data: ")) data.push(line.slice(6))
            }
            if (data.length > 0) Queue.unsafeOffer(events, { id, data: data.join("\n") })
          }
        }
      } catch {
        // aborted or cut
      }
      Deferred.unsafeDone(ended, Exit.void)
    })()
    const next = Queue.take(events).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("no SSE event within 10 s") }), Effect.orDie)
    return { next, ended: Deferred.await(ended) }
  })
