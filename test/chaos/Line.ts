/**
 * A client that outlives its sockets, as a real one must across an edge's death: it keeps one
 * socket at a time to an edge, redoes its protocol's handshake on every new socket, and moves to
 * the next edge when the one it was on is gone (docs/operations.md, "Client retry policy").
 */
import * as Data from "effect/Data"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as FiberSet from "effect/FiberSet"
import * as Queue from "effect/Queue"
import * as Ref from "effect/Ref"
import { WebSocket } from "ws"

export type Json = Readonly<Record<string, unknown>>

/** A request that got no answer: its socket closed, it timed out, or no session came up in time. */
export class Unanswered extends Data.TaggedError("Unanswered")<{ readonly reason: string }> {
  override get message(): string {
    return this.reason
  }
}

/** The retry policy's numbers, written down in docs/operations.md. */
export const Policy = {
  /** A request with no answer this long is given up on and sent again. */
  answerTimeout: Duration.seconds(3),
  /**
   * Attempts per request (the first included). With the pauses, a request that fails at once keeps
   * trying for ~8 s, past a crashed replica's adoption (its heartbeat key expires after 6 s); one
   * that times out every time, for ~26 s.
   */
  attempts: 6,
  /** The pause before a request is sent again: 250 ms, doubling each time. */
  retryPause: (attempt: number) => Duration.millis(250 * 2 ** attempt),
  /** Reconnect backoff: 100 ms, doubling, at most 2 s, to the same edge slot if it serves, else the next. */
  reconnectFirst: 100,
  reconnectMax: 2_000,
  /** How long a socket gets to open and finish its handshake before the client tries the next edge. */
  setupTimeout: Duration.seconds(10)
} as const

/** One socket: requests by id, every other message to `incoming`. */
export interface Line {
  readonly slot: number
  readonly url: string
  readonly send: (message: Json) => void
  /** Sends a JSON-RPC request with a fresh id and waits for the answer. */
  readonly request: (method: string, params: Json, timeout?: Duration.DurationInput) => Effect.Effect<Json, Unanswered>
  readonly incoming: Queue.Queue<Json>
  readonly closed: Deferred.Deferred<{ readonly code: number; readonly reason: string }>
  readonly close: () => void
}

let ids = 0

export const openLine = (slot: number, url: string, protocols: ReadonlyArray<string> = []) =>
  Effect.gen(function*() {
    const incoming = yield* Queue.unbounded<Json>()
    const closed = yield* Deferred.make<{ readonly code: number; readonly reason: string }>()
    const pending = new Map<string, Deferred.Deferred<Json, Unanswered>>()
    const ws = new WebSocket(url, [...protocols])
    ws.on("message", (data) => {
      let message: unknown
      try {
        message = JSON.parse(data.toString())
      } catch {
        return
      }
      if (typeof message !== "object" || message === null || Array.isArray(message)) return
      const m = message as Json
      const waiting = "method" in m ? undefined : pending.get(String(m["id"]))
      if (waiting !== undefined) {
        pending.delete(String(m["id"]))
        Deferred.unsafeDone(waiting, Effect.succeed(m))
      } else Queue.unsafeOffer(incoming, m)
    })
    ws.on("close", (code, reason) => {
      Deferred.unsafeDone(closed, Effect.succeed({ code, reason: reason.toString() }))
      for (const d of pending.values()) Deferred.unsafeDone(d, Effect.fail(new Unanswered({ reason: `socket closed (${code})` })))
      pending.clear()
    })
    // A socket that never opens is given up on by the caller's timeout; ws reports its error as a close too.
    ws.on("error", () => undefined)
    yield* Effect.async<void, Unanswered>((resume) => {
      ws.once("open", () => resume(Effect.void))
      ws.once("unexpected-response", (_req, res) => resume(Effect.fail(new Unanswered({ reason: `upgrade refused with ${res.statusCode}` }))))
      ws.once("close", (code) => resume(Effect.fail(new Unanswered({ reason: `closed ${code} before it opened` }))))
    }).pipe(Effect.onInterrupt(() => Effect.sync(() => ws.terminate())))
    const send = (message: Json) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(message))
    }
    const request = (method: string, params: Json, timeout: Duration.DurationInput = Policy.answerTimeout) =>
      Effect.gen(function*() {
        const id = `q-${++ids}`
        const answer = yield* Deferred.make<Json, Unanswered>()
        if (ws.readyState !== WebSocket.OPEN) return yield* Effect.fail(new Unanswered({ reason: "socket not open" }))
        pending.set(id, answer)
        send({ jsonrpc: "2.0", id, method, params })
        return yield* Deferred.await(answer).pipe(
          Effect.timeoutFail({ duration: timeout, onTimeout: () => new Unanswered({ reason: `no answer to ${method} within ${Duration.format(Duration.decode(timeout))}` }) }),
          Effect.ensuring(Effect.sync(() => pending.delete(id)))
        )
      })
    return { slot, url, send, request, incoming, closed, close: () => ws.terminate() } satisfies Line
  })

/** Where a reconnecting client may go: the ws:// base of the edge in a slot, if it serves. */
export interface Edges {
  readonly count: number
  readonly at: (slot: number) => string | undefined
}

export interface PeerOptions<S> {
  readonly name: string
  /** The edge slot it connects to first. */
  readonly home: number
  readonly edges: Edges
  readonly url: (ws: string) => string
  readonly protocols?: ReadonlyArray<string>
  /** The protocol's handshake on a new socket; its result is the session's state. */
  readonly setup: (line: Line, reconnect: boolean) => Effect.Effect<S, unknown>
  /** Handles what arrives once the session is up (requests from the server, notifications). */
  readonly serve: (line: Line, state: S, message: Json) => void
}

export interface Session<S> {
  readonly line: Line
  readonly state: S
}

export interface Peer<S> {
  readonly name: string
  /** The current session, waiting up to `wait` for one while the client reconnects. */
  readonly session: (wait: Duration.DurationInput) => Effect.Effect<Session<S>, Unanswered>
  /** The slot of the edge it is connected to now, if any. */
  readonly slot: () => number | undefined
  /** Takes the session out of use while `redo` runs on its socket (a proxy client re-attaching); a failure reconnects. */
  readonly redo: (redo: (line: Line) => Effect.Effect<S, unknown>) => void
  readonly reconnects: () => number
  /** Drops the socket, as a network blip would: the client reconnects as after any close. */
  readonly reconnect: () => void
}

/** A client that reconnects for as long as the scope lives. */
export const peer = <S>(options: PeerOptions<S>) =>
  Effect.gen(function*() {
    const ready = yield* Ref.make(yield* Deferred.make<Session<S>>())
    let current: Session<S> | undefined
    let reconnects = 0
    let redoing: Fiber.RuntimeFiber<void> | undefined
    const run = yield* FiberSet.makeRuntime<never>()
    const unready = Effect.gen(function*() {
      const d = yield* Ref.get(ready)
      if (yield* Deferred.isDone(d)) yield* Ref.set(ready, yield* Deferred.make<Session<S>>())
    })

    const pick = (from: number, tries: number): { readonly slot: number; readonly ws: string } | undefined => {
      for (let i = 0; i < options.edges.count; i++) {
        const slot = (from + tries + i) % options.edges.count
        const ws = options.edges.at(slot)
        if (ws !== undefined) return { slot, ws }
      }
      return undefined
    }

    const connected = (line: Line, reconnect: boolean) =>
      Effect.gen(function*() {
        const state = yield* options.setup(line, reconnect).pipe(
          Effect.timeoutFail({ duration: Policy.setupTimeout, onTimeout: () => new Unanswered({ reason: "handshake timed out" }) })
        )
        current = { line, state }
        yield* Deferred.succeed(yield* Ref.get(ready), current)
        const serving = yield* Queue.take(line.incoming).pipe(
          Effect.flatMap((m) => Effect.sync(() => current?.line === line && options.serve(line, current.state, m))),
          Effect.forever,
          Effect.fork
        )
        yield* Deferred.await(line.closed)
        yield* Fiber.interrupt(serving)
      })

    const loop = Effect.gen(function*() {
      let from = options.home
      let tries = 0
      let first = true
      for (;;) {
        const target = pick(from, tries)
        if (target !== undefined) {
          const outcome = yield* openLine(target.slot, options.url(target.ws), options.protocols).pipe(
            Effect.timeoutFail({ duration: Policy.setupTimeout, onTimeout: () => new Unanswered({ reason: "socket did not open" }) }),
            Effect.flatMap((line) =>
              connected(line, !first).pipe(
                Effect.ensuring(Effect.sync(() => line.close())),
                Effect.as(line.slot)
              )
            ),
            Effect.either
          )
          current = undefined
          yield* unready
          if (outcome._tag === "Right") {
            // It was up and its socket closed: back to the same slot first (a replaced edge serves there).
            first = false
            reconnects++
            from = outcome.right
            tries = 0
            yield* Effect.logDebug(`${options.name}: socket on slot ${outcome.right} closed; reconnecting`)
          } else {
            yield* Effect.logDebug(`${options.name}: ${String(outcome.left)}`)
            tries++
          }
        } else tries++
        yield* Effect.sleep(Math.min(Policy.reconnectMax, Policy.reconnectFirst * 2 ** Math.max(0, tries - 1)))
      }
    })
    yield* Effect.forkScoped(loop)

    const redo = (again: (line: Line) => Effect.Effect<S, unknown>) => {
      const session = current
      if (session === undefined || redoing !== undefined) return
      redoing = run(
        Effect.gen(function*() {
          yield* unready
          const state = yield* again(session.line)
          if (current?.line !== session.line) return
          current = { line: session.line, state }
          yield* Deferred.succeed(yield* Ref.get(ready), current)
        }).pipe(
          Effect.catchAll(() => Effect.sync(() => session.line.close())),
          Effect.ensuring(Effect.sync(() => (redoing = undefined)))
        )
      )
    }

    return {
      name: options.name,
      session: (wait) =>
        Ref.get(ready).pipe(
          Effect.flatMap(Deferred.await),
          Effect.timeoutFail({ duration: wait, onTimeout: () => new Unanswered({ reason: `${options.name} not connected` }) })
        ),
      slot: () => current?.line.slot,
      redo,
      reconnects: () => reconnects,
      reconnect: () => current?.line.close()
    } satisfies Peer<S>
  })
