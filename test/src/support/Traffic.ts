/**
 * Steady request traffic from a client through a service to a serving peer while a replica stops:
 * what the hand-off tests measure. Each request is answered by the peer `inFlight` requests after
 * it was received, so that many are always unanswered when the stop comes; the last ones are
 * answered once the stop is over, at whichever replica then holds the sockets.
 */
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import type { Message } from "./ProxyPeers.ts"

export interface Traffic<S> {
  readonly inFlight: number
  /** Sends request `n` (1, 2, …) from the client. */
  readonly send: (n: number) => void
  /** What the peer received of the request just sent. */
  readonly received: Effect.Effect<S>
  /** The peer answers a request it received. */
  readonly answer: (seen: S) => void
  /** The client's next message. */
  readonly reply: Effect.Effect<Message>
  /** Whether a message the client got is an answer at all (not a notification, say); all are by default. */
  readonly isAnswer?: (m: Message) => boolean
  /** Whether `m` is the right answer to request `n`. */
  readonly isOwn: (n: number, m: Message) => boolean
}

/**
 * Runs `traffic` for 100 requests, then while `stop` runs and 100 more, then answers the rest and
 * collects the client's answers (for at most 10 s). Counts what was lost (never answered), wrong
 * (answered twice, or not with its own answer) and answered with an error.
 */
export const throughStop = <S>(traffic: Traffic<S>, stop: Effect.Effect<void>) =>
  Effect.gen(function*() {
    const seen: Array<S> = []
    let sent = 0
    /** One step: a request goes out, the peer gets it and answers an older one. */
    const step = Effect.gen(function*() {
      traffic.send(++sent)
      seen.push(yield* traffic.received)
      if (seen.length > traffic.inFlight) traffic.answer(seen[seen.length - traffic.inFlight - 1]!)
    })
    for (let i = 0; i < 100; i++) yield* step

    const stopped = yield* Deferred.make<number>()
    const started = performance.now()
    const stopping = yield* stop.pipe(
      Effect.zipRight(Effect.suspend(() => Deferred.succeed(stopped, performance.now() - started))),
      Effect.fork
    )
    let after = 0
    while (!(yield* Deferred.isDone(stopped)) || after++ < 100) yield* step
    const stopMillis = Math.round(yield* Deferred.await(stopped))
    yield* Fiber.join(stopping)
    for (const s of seen.slice(-traffic.inFlight)) traffic.answer(s)

    const answers = new Map<number, Message>()
    let wrong = 0
    let errors = 0
    const collect = Effect.gen(function*() {
      while (answers.size < sent) {
        const m = yield* traffic.reply
        if (traffic.isAnswer !== undefined && !traffic.isAnswer(m)) continue
        const n = m.id as number
        if (answers.has(n)) wrong++
        answers.set(n, m)
        if (m.error !== undefined) errors++
        else if (!traffic.isOwn(n, m)) wrong++
      }
    })
    yield* collect.pipe(Effect.timeout("10 seconds"), Effect.ignore)
    return { sent, seen, stopMillis, lost: sent - answers.size, wrong, errors }
  })
