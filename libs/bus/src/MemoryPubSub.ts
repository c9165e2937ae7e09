/**
 * The embedded adapter of the Bus port: publish, subscribe and request in one process. Delivery is
 * asynchronous and FIFO across the whole bus (one microtask-batched queue), so a handler that
 * publishes never re-enters another handler, and per-publisher order holds as it does on NATS.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Stream from "effect/Stream"
import { randomUUID } from "node:crypto"
import { acquireReleaseSync } from "./ActorResource.ts"
import {
  BusError,
  type BusMessage,
  type BusShape,
  DEFAULT_REQUEST_TIMEOUT,
  type Headers,
  isWildcard,
  NoResponders,
  RequestTimeout,
  subjectMatches,
  type Subscription,
  toBytes
} from "./Bus.ts"

interface Subscriber {
  readonly subject: string
  readonly queue: string | undefined
  readonly handler: (message: BusMessage) => void
}

const noHeaders: Headers = {}

class Message implements BusMessage {
  constructor(
    readonly subject: string,
    readonly data: Uint8Array,
    readonly headers: Headers,
    readonly reply: string | undefined
  ) {}
  header(name: string): string | undefined {
    const value = this.headers[name]
    return value === "" ? undefined : value
  }
}

const closed = () => new BusError({ reason: "Closed", message: "the embedded bus is closed" })

/**
 * A subscription whose `drain` is built when asked for: an actor holds its subscription for the
 * connection's life and drains it only in a hand-off, and an Effect built up front was a few
 * hundred bytes of every idle connection (issue 16).
 */
class MemorySubscription implements Subscription {
  constructor(
    private readonly subscriber: Subscriber,
    private readonly remove: (s: Subscriber) => void
  ) {}
  get drain() {
    return Effect.sync(() => this.remove(this.subscriber))
  }
}

type RequestResult = Either.Either<BusMessage, NoResponders | RequestTimeout | BusError>

/** A request's callback: one that throws is a bug in its caller, and must not stop the bus or the process. */
const tell = (onResult: (result: RequestResult) => void, result: RequestResult, subject: string) => {
  try {
    onResult(result)
  } catch (cause) {
    console.error(`embedded bus: the callback of a request to ${subject} threw`, cause)
  }
}

export const makeBus = (): BusShape => {
  // Exact subjects are looked up in a map: actors subscribe one subject per connection, and a
  // publish must not scan them all. Wildcard subscriptions are few and scanned.
  const exact = new Map<string, Array<Subscriber>>()
  const wildcard: Array<Subscriber> = []
  const roundRobin = new Map<string, number>()
  let pending: Array<Message> = []
  let scheduled = false
  let isClosed = false

  const matching = (subject: string): Array<Subscriber> => {
    const direct = exact.get(subject)
    if (wildcard.length === 0) return direct ?? []
    const found = direct ? direct.slice() : []
    for (const s of wildcard) if (subjectMatches(s.subject, subject)) found.push(s)
    return found
  }

  const deliver = (message: Message) => {
    const subscribers = matching(message.subject)
    // A lone subscriber, in a queue group or not, takes every message: no group map to build per
    // message (every stateless request to the registry's queue group made one, issue 28).
    if (subscribers.length === 1) return subscribers[0]!.handler(message)
    let groups: Map<string, Array<Subscriber>> | undefined
    for (const s of subscribers) {
      if (s.queue === undefined) {
        s.handler(message)
      } else {
        groups ??= new Map()
        const members = groups.get(s.queue)
        if (members) members.push(s)
        else groups.set(s.queue, [s])
      }
    }
    if (groups) {
      for (const [queue, members] of groups) {
        // One member (every actor's subject, but during a hand-off): no turn to keep.
        if (members.length === 1) {
          members[0]!.handler(message)
          continue
        }
        const key = `${queue} ${message.subject}`
        const turn = roundRobin.get(key) ?? 0
        roundRobin.set(key, turn + 1)
        members[turn % members.length]!.handler(message)
      }
    }
  }

  const flush = () => {
    scheduled = false
    while (pending.length > 0) {
      const batch = pending
      pending = []
      for (const message of batch) {
        try {
          deliver(message)
        } catch (cause) {
          // A throwing handler is a bug in that handler; it must not stop delivery to others.
          console.error(`embedded bus: handler for ${message.subject} threw`, cause)
        }
      }
    }
  }

  const unsafePublish = (subject: string, data: Uint8Array | string, headers?: Headers, reply?: string) => {
    if (isClosed) throw closed()
    pending.push(new Message(subject, toBytes(data), headers ?? noHeaders, reply))
    if (!scheduled) {
      scheduled = true
      queueMicrotask(flush)
    }
  }

  const publish = (subject: string, data: Uint8Array | string, headers?: Headers) =>
    Effect.try({ try: () => unsafePublish(subject, data, headers), catch: () => closed() })

  const add = (s: Subscriber) => {
    if (isWildcard(s.subject)) {
      wildcard.push(s)
    } else {
      const list = exact.get(s.subject)
      if (list) list.push(s)
      else exact.set(s.subject, [s])
    }
  }
  const remove = (s: Subscriber) => {
    if (s.queue !== undefined) roundRobin.delete(`${s.queue} ${s.subject}`)
    if (isWildcard(s.subject)) {
      const i = wildcard.indexOf(s)
      if (i >= 0) wildcard.splice(i, 1)
      return
    }
    const list = exact.get(s.subject)
    if (!list) return
    const i = list.indexOf(s)
    if (i >= 0) list.splice(i, 1)
    if (list.length === 0) exact.delete(s.subject)
  }

  // Not Effect.acquireRelease: one subscription per connection, whose release needs no fiber refs of its own.
  const subscribe: BusShape["subscribe"] = (subject, handler, options) =>
    acquireReleaseSync(
      Effect.suspend(() => {
        if (isClosed) return Effect.fail(closed())
        const s: Subscriber = { subject, queue: options?.queue, handler }
        add(s)
        return Effect.succeed(s)
      }),
      remove
    ).pipe(
      // Deliveries are looked up when they run, so a member that leaves misses nothing: what was
      // published before goes to the members left.
      Effect.map((s) => new MemorySubscription(s, remove))
    )

  const stream: BusShape["stream"] = (subject, options) =>
    Stream.asyncScoped<BusMessage, BusError>((emit) =>
      subscribe(subject, (m) => void emit.single(m), options)
    )

  // One callback and one timer, not a fiber racing a sleep: a request in flight holds only these
  // (a handshake asks twice, and thousands of handshakes may be in flight at once).
  const unsafeRequest: BusShape["unsafeRequest"] = (subject, data, options, onResult) => {
    let failed: NoResponders | BusError | undefined
    if (matching(subject).length === 0) failed = new NoResponders({ subject })
    else if (isClosed) failed = closed()
    if (failed !== undefined) {
      // Told on the next microtask, as an answer would be: the caller is never re-entered.
      const why = failed
      let cancelled = false
      queueMicrotask(() => cancelled || tell(onResult, Either.left(why), subject))
      return () => void (cancelled = true)
    }
    const timeout = options?.timeout ?? DEFAULT_REQUEST_TIMEOUT
    // The inbox goes as the answer arrives or the time is up: an inbox left in `exact` kept its
    // handler, the waiting callback and the answer.
    const s: Subscriber = {
      subject: `_INBOX.${randomUUID()}`,
      queue: undefined,
      handler: (m) => {
        clearTimeout(timer)
        remove(s)
        tell(onResult, Either.right(m), subject)
      }
    }
    const timer = setTimeout(() => {
      remove(s)
      tell(onResult, Either.left(new RequestTimeout({ subject, timeout: Duration.decode(timeout) })), subject)
    }, Duration.toMillis(timeout))
    add(s)
    unsafePublish(subject, data, options?.headers, s.subject)
    return () => {
      clearTimeout(timer)
      remove(s)
    }
  }

  const request: BusShape["request"] = (subject, data, options) =>
    Effect.async<BusMessage, NoResponders | RequestTimeout | BusError>((resume) => {
      const cancel = unsafeRequest(subject, data, options, resume)
      return Effect.sync(cancel)
    })

  const respond: BusShape["respond"] = (message, data, headers) =>
    message.reply === undefined ? Effect.void : publish(message.reply, data, headers)

  const drain = Effect.sync(() => {
    if (isClosed) return
    flush()
    isClosed = true
    exact.clear()
    wildcard.length = 0
  })

  return { publish, unsafePublish, subscribe, stream, request, unsafeRequest, respond, flush: Effect.void, drain, shared: false, isConnected: () => !isClosed, onReconnect: () => Effect.void }
}
