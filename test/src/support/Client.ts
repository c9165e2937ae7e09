/**
 * A WebSocket test client as an Effect resource: messages go into a queue and the close arrives in
 * a Deferred, so tests wait on events rather than time.
 */
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Duration from "effect/Duration"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Net from "node:net"
import { type ClientOptions, WebSocket } from "ws"

export interface TestClient {
  readonly ws: WebSocket
  readonly messages: Queue.Queue<string>
  readonly closed: Deferred.Deferred<{ readonly code: number; readonly reason: string }>
  readonly send: (data: string | object) => void
  /** The next message, parsed as JSON. */
  readonly next: Effect.Effect<unknown>
  readonly nextText: Effect.Effect<string>
}

export class UpgradeRefused extends Error {
  constructor(
    readonly status: number,
    readonly body: string
  ) {
    super(`upgrade refused with ${status}: ${body}`)
  }
}

/** Opens a socket; fails with `UpgradeRefused` when the server answers the upgrade with an HTTP error. */
export const connect = (url: string, options: ClientOptions & { readonly protocols?: ReadonlyArray<string> } = {}) =>
  Effect.acquireRelease(
    Effect.gen(function*() {
      const messages = yield* Queue.unbounded<string>()
      const closed = yield* Deferred.make<{ readonly code: number; readonly reason: string }>()
      const { protocols, ...rest } = options
      const ws = new WebSocket(url, protocols === undefined ? [] : [...protocols], rest)
      ws.on("message", (data) => void Queue.unsafeOffer(messages, data.toString()))
      ws.on("close", (code, reason) => void Deferred.unsafeDone(closed, Effect.succeed({ code, reason: reason.toString() })))
      yield* Effect.async<void, UpgradeRefused | Error>((resume) => {
        ws.once("open", () => resume(Effect.void))
        ws.once("unexpected-response", (_req, res) => {
          let body = ""
          res.on("data", (chunk: Buffer) => (body += chunk.toString()))
          res.on("end", () => resume(Effect.fail(new UpgradeRefused(res.statusCode ?? 0, body.trim()))))
        })
        ws.once("error", (e) => resume(Effect.fail(e)))
      })
      const timeout = <A>(e: Effect.Effect<A>) => Effect.timeoutFail(e, { duration: "10 seconds", onTimeout: () => new Error("no message within 10s") }).pipe(Effect.orDie)
      // A message already queued comes first; otherwise the wait ends with the socket's close, so a
      // server that closed instead of answering reads as that close, not as a 10 s silence.
      const take = Queue.poll(messages).pipe(
        Effect.flatMap(Option.match({
          onSome: Effect.succeed,
          onNone: () =>
            Effect.raceFirst(
              Queue.take(messages),
              Deferred.await(closed).pipe(Effect.flatMap(({ code, reason }) => Effect.dieMessage(`socket closed (${code} ${reason}) before a message`)))
            )
        }))
      )
      return {
        ws,
        messages,
        closed,
        send: (data: string | object) => ws.send(typeof data === "string" ? data : JSON.stringify(data)),
        nextText: timeout(take),
        next: timeout(Effect.map(take, (s): unknown => JSON.parse(s)))
      } satisfies TestClient
    }),
    (c) => Effect.sync(() => c.ws.terminate())
  )

/** Waits for the socket to close and returns its code and reason. */
export const closedWith = (c: TestClient) =>
  Deferred.await(c.closed).pipe(Effect.timeoutFail({ duration: "15 seconds", onTimeout: () => new Error("socket did not close") }), Effect.orDie)

/**
 * Writes a raw request to 127.0.0.1:`port` and returns the status line's code, for targets no HTTP
 * client sends; "closed" when the server closed the connection without one.
 */
export const rawStatus = (port: number, request: string, timeout: Duration.DurationInput = "15 seconds") =>
  Effect.async<number | "closed">((resume) => {
    const socket = Net.connect(port, "127.0.0.1", () => socket.write(request))
    let answer = ""
    socket.on("data", (chunk: Buffer) => {
      answer += chunk.toString("latin1")
      const line = /^HTTP\/1\.1 (\d{3}) /.exec(answer)
      if (line !== null) {
        resume(Effect.succeed(Number(line[1])))
        socket.destroy()
      }
    })
    socket.on("error", () => socket.destroy())
    socket.on("close", () => resume(Effect.succeed("closed")))
    return Effect.sync(() => socket.destroy())
  }).pipe(Effect.timeoutFail({ duration: timeout, onTimeout: () => new Error(`no answer within ${Duration.format(timeout)}`) }), Effect.orDie)
