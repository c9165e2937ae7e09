/**
 * The message bus port: publish with headers, subscribe (optionally in a queue group), request/reply
 * and drain. Two adapters implement it, NATS and an embedded in-memory one, and one contract suite
 * checks both. Hot paths (the edge, actors) use the callback forms; everything else gets Effects.
 */
import * as Context from "effect/Context"
import * as Data from "effect/Data"
import type * as Duration from "effect/Duration"
import type * as Effect from "effect/Effect"
import type * as Either from "effect/Either"
import type * as Scope from "effect/Scope"
import type * as Stream from "effect/Stream"

export type Headers = Readonly<Record<string, string>>

export interface BusMessage {
  readonly subject: string
  /** Owned by the receiver; publishers must not mutate a buffer after publishing it. */
  readonly data: Uint8Array
  readonly reply: string | undefined
  /** A header's value; an absent or empty header is `undefined`. */
  readonly header: (name: string) => string | undefined
}

export class BusError extends Data.TaggedError("BusError")<{
  readonly reason: "Closed" | "Connect" | "Publish" | "Subscribe" | "Drain" | "Kv"
  readonly message: string
  readonly cause?: unknown
}> {}

/** Nobody listens on the subject of a request. */
export class NoResponders extends Data.TaggedError("NoResponders")<{ readonly subject: string }> {
  override get message() {
    return `no responders on ${this.subject}`
  }
}

export class RequestTimeout extends Data.TaggedError("RequestTimeout")<{
  readonly subject: string
  readonly timeout: Duration.Duration
}> {}

export interface SubscribeOptions {
  /** Members of one queue group share the messages: each goes to exactly one of them. */
  readonly queue?: string
}

/** A live subscription; closing its scope stops it at once. */
export interface Subscription {
  /**
   * Stops it gracefully: the server is told, and every message it routed here before it knew is
   * still handed to the handler. A queue member that leaves this way loses nothing to the gap.
   */
  readonly drain: Effect.Effect<void>
}

export interface RequestOptions {
  readonly headers?: Headers
  readonly timeout?: Duration.DurationInput
}

export interface BusShape {
  readonly publish: (subject: string, data: Uint8Array | string, headers?: Headers) => Effect.Effect<void, BusError>
  /** Synchronous publish for hot paths; throws a `BusError` only once the bus is closed. */
  readonly unsafePublish: (subject: string, data: Uint8Array | string, headers?: Headers, reply?: string) => void
  /**
   * Calls `handler` for every message, in order, until the scope closes. The handler runs on the
   * adapter's delivery path, so it must not block: hand work to a queue or fiber.
   */
  readonly subscribe: (
    subject: string,
    handler: (message: BusMessage) => void,
    options?: SubscribeOptions
  ) => Effect.Effect<Subscription, BusError, Scope.Scope>
  readonly stream: (subject: string, options?: SubscribeOptions) => Stream.Stream<BusMessage, BusError>
  readonly request: (
    subject: string,
    data: Uint8Array | string,
    options?: RequestOptions
  ) => Effect.Effect<BusMessage, NoResponders | RequestTimeout | BusError>
  /**
   * `request` with a callback, for the hot paths of a handshake (the edge's open of a connection,
   * its token check): a request in flight holds only the callback and the adapter's own state. A
   * fiber awaiting `request` held itself, its context and its continuations for as long as the
   * answer took, long enough for a scavenge to promote them, and every handshake left them behind
   * in the old generation (issue 29). `onResult` is called once, never before this returns; the
   * function returned cancels the request (its callback is then never called).
   */
  readonly unsafeRequest: (
    subject: string,
    data: Uint8Array | string,
    options: RequestOptions | undefined,
    onResult: (result: Either.Either<BusMessage, NoResponders | RequestTimeout | BusError>) => void
  ) => () => void
  /** Answers a request; does nothing for a message that carries no reply subject. */
  readonly respond: (message: BusMessage, data: Uint8Array | string, headers?: Headers) => Effect.Effect<void, BusError>
  /**
   * Completes once the server has seen everything this process sent before, subscriptions
   * included: after it, a new queue member gets its share of what others publish.
   */
  readonly flush: Effect.Effect<void, BusError>
  /** Flushes what was published and stops all subscriptions. Idempotent. */
  readonly drain: Effect.Effect<void>
  /**
   * Whether other processes can reach this bus (NATS), so that a replica elsewhere can take over
   * what this one leaves. The embedded bus is its process's alone.
   */
  readonly shared: boolean
  /** Whether the bus can currently reach its peers (NATS connected; the embedded bus is always). */
  readonly isConnected: () => boolean
  /**
   * Calls `listener` each time the connection comes back after it was lost, for as long as the
   * scope lives. Whatever was published to this process's subscriptions meanwhile is gone: core
   * NATS does not keep it. The embedded bus is never lost.
   */
  readonly onReconnect: (listener: () => void) => Effect.Effect<void, never, Scope.Scope>
}

export class Bus extends Context.Tag("@switchboard/bus/Bus")<Bus, BusShape>() {}

export const DEFAULT_REQUEST_TIMEOUT = "5 seconds"

const decoder = new TextDecoder()
/**
 * A string's UTF-8 bytes. Buffer.from, not TextEncoder: a short frame's bytes come from Node's
 * pooled slab instead of a new ArrayBuffer per frame.
 */
export const toBytes = (data: Uint8Array | string): Uint8Array => (typeof data === "string" ? Buffer.from(data) : data)
/** The UTF-8 text of a message, a journal entry, or anything else that carries `data`. */
export const text = (message: { readonly data: Uint8Array }): string => decoder.decode(message.data)

/** `*` matches one token, `>` one or more trailing tokens, as in NATS. */
export const subjectMatches = (pattern: string, subject: string): boolean => {
  if (pattern === subject) return true
  const p = pattern.split(".")
  const s = subject.split(".")
  for (let i = 0; i < p.length; i++) {
    const token = p[i]
    if (token === ">") return s.length > i
    if (i >= s.length) return false
    if (token !== "*" && token !== s[i]) return false
  }
  return p.length === s.length
}

export const isWildcard = (subject: string): boolean => subject.split(".").some((t) => t === "*" || t === ">")
