/**
 * Requests over NATS, answered on one subscription: each request's reply subject is a token under
 * this connection's own inbox, and one `TimedMap` per timeout bounds how long it waits. nats.js's
 * own `request` made a promise, a deferred, a timeout promise, a race and a timer per request;
 * with a hundred handshakes in flight at an edge those outlived the young generation, and were an
 * eighth of what each handshake left for the old one (issue 29).
 */
import { createInbox, type Msg, type MsgHdrs, type NatsConnection, type Subscription } from "@nats-io/transport-node"
import { TimedMap } from "./TimedMap.ts"

/** How a request ended: its answer, no responder (NATS's 503), no answer in time, or the connection closed. */
export type Outcome =
  | { readonly _tag: "Answer"; readonly msg: Msg }
  | { readonly _tag: "NoResponders" }
  | { readonly _tag: "Timeout" }
  | { readonly _tag: "Closed" }

const TIMEOUT: Outcome = { _tag: "Timeout" }
const NO_RESPONDERS: Outcome = { _tag: "NoResponders" }
const CLOSED: Outcome = { _tag: "Closed" }

export class NatsRequests<P> {
  private readonly inbox: string
  private subscription: Subscription | undefined
  private next = 0
  /**
   * Requests in flight by token, one map per timeout. Timeouts come from settings and constants, so
   * a service has two or three; a timeout computed per request would make a map each.
   */
  private readonly byTimeout = new Map<number, TimedMap<string, P>>()

  constructor(
    private readonly nc: NatsConnection,
    /** Called once per request that was not cancelled, with how it ended. */
    private readonly settle: (pending: P, outcome: Outcome) => void
  ) {
    this.inbox = createInbox()
  }

  /** Publishes a request for `pending`; the function returned cancels it (`settle` is then never called for it). */
  send(subject: string, data: Uint8Array, headers: MsgHdrs | undefined, timeoutMillis: number, pending: P): () => void {
    const token = String(++this.next)
    const waiting = this.waitingFor(timeoutMillis)
    this.subscription ??= this.nc.subscribe(`${this.inbox}.*`, { callback: this.onReply })
    waiting.set(token, pending)
    try {
      this.nc.publish(subject, data, headers === undefined ? { reply: `${this.inbox}.${token}` } : { reply: `${this.inbox}.${token}`, headers })
    } catch (cause) {
      waiting.delete(token)
      throw cause
    }
    return () => void waiting.delete(token)
  }

  /** Every request in flight ends as closed: the connection is gone, and no answer will come. */
  close(): void {
    for (const waiting of this.byTimeout.values()) {
      const ended = [...waiting.values()]
      waiting.clear()
      for (const pending of ended) this.settle(pending, CLOSED)
    }
  }

  private waitingFor(millis: number): TimedMap<string, P> {
    let waiting = this.byTimeout.get(millis)
    if (waiting === undefined) {
      waiting = new TimedMap<string, P>(millis, (_token, pending) => this.settle(pending, TIMEOUT))
      this.byTimeout.set(millis, waiting)
    }
    return waiting
  }

  private readonly onReply = (err: Error | null, msg: Msg) => {
    if (err !== null) return
    const token = msg.subject.slice(this.inbox.length + 1)
    for (const waiting of this.byTimeout.values()) {
      const pending = waiting.get(token)
      if (pending === undefined) continue
      waiting.delete(token)
      // NATS answers a request nobody subscribes to with an empty message of status 503.
      return this.settle(pending, msg.data.length === 0 && msg.headers?.code === 503 ? NO_RESPONDERS : { _tag: "Answer", msg })
    }
  }
}
