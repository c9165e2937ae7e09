/**
 * An actor's mailbox: messages are handled one at a time, in arrival order. A handler that
 * finishes synchronously runs right where the message arrives, with no fiber to wake; one that
 * returns an Effect is forked, and the mailbox waits for it before the next message. Messages that
 * arrive while a message is being handled (a local peer's answer, say) are queued, never handled
 * inside it. A hand-off pauses it and takes what is left.
 */
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import type * as Fiber from "effect/Fiber"
import type { BusMessage } from "./Bus.ts"

export type Envelope = BusMessage | "edge-lost"

export class Mailbox<R> {
  private queue: Array<Envelope> = []
  private head = 0
  private handler: ((m: Envelope) => Effect.Effect<void, never, R> | void) | undefined
  private busy = true
  /** Set by `pause` until the mailbox is idle; then called once. */
  private pausing: (() => void) | undefined
  constructor(private readonly fork: (work: Effect.Effect<void, never, R>) => Fiber.RuntimeFiber<void, never>) {}

  offer(m: Envelope) {
    this.queue.push(m)
    if (!this.busy) this.drain()
  }
  /** Begins handling, including what arrived before the actor was ready. */
  start(handler: (m: Envelope) => Effect.Effect<void, never, R> | void) {
    this.handler = handler
    this.busy = false
    this.drain()
  }
  /** Ignores everything from now on. */
  stop() {
    // Without its handler, a handler's Effect still in flight cannot wake the mailbox when it ends.
    this.handler = undefined
    this.busy = true
    this.pausing = undefined
    this.queue.length = 0
    this.head = 0
  }
  /**
   * Handles nothing after the message in hand; `then` runs once that one is done. Later messages
   * wait (see `rest`). Called from a handler, it stops right after that message.
   */
  pause(then: () => void) {
    this.pausing = then
    if (!this.busy) this.paused()
  }
  /** What waits unhandled, in order; the mailbox is left empty. */
  rest(): Array<Envelope> {
    const rest = this.queue.slice(this.head)
    this.queue = []
    this.head = 0
    return rest
  }
  /** Puts messages before everything queued (a hand-off's forwarded messages, older than those). */
  prepend(messages: ReadonlyArray<Envelope>) {
    this.queue.splice(this.head, 0, ...messages)
  }
  private paused() {
    const then = this.pausing
    this.pausing = undefined
    this.busy = true
    then?.()
  }
  private drain() {
    const handler = this.handler
    if (handler === undefined) return
    this.busy = true
    while (this.head < this.queue.length) {
      if (this.pausing !== undefined) return this.paused()
      const m = this.queue[this.head]!
      this.head++
      let work: Effect.Effect<void, never, R> | void
      try {
        work = handler(m)
      } catch (cause) {
        // As a defect, so the logger prints the error's message and stack, not `{}`.
        work = Effect.logError("actor handler threw", Cause.die(cause))
      }
      if (work !== undefined) {
        this.fork(work).addObserver(() => {
          if (this.handler === undefined) return
          this.busy = false
          this.drain()
        })
        return
      }
    }
    this.queue.length = 0
    this.head = 0
    this.busy = false
    if (this.pausing !== undefined) this.paused()
  }
}
