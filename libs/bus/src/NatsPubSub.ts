/**
 * The NATS adapter of the Bus port: core publish, subscribe and request over the shared connection,
 * every subject under the namespace. Headers are handed to nats.js in a form it need not copy, and
 * read from the raw header block, since these are the hottest paths of every service.
 */
import { type Msg, type MsgHdrs, type PublishOptions } from "@nats-io/transport-node"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Stream from "effect/Stream"
import { acquireReleaseSync } from "./ActorResource.ts"
import {
  BusError,
  type BusMessage,
  type BusShape,
  DEFAULT_REQUEST_TIMEOUT,
  type Headers,
  NoResponders,
  RequestTimeout,
  toBytes
} from "./Bus.ts"
import { corker, FrozenHeaders, rawHeaderBlock } from "./internal/NatsShims.ts"
import type { NatsLink } from "./NatsConnection.ts"
import { busError } from "./NatsFailures.ts"
import { NatsRequests } from "./NatsRequests.ts"

/**
 * Hot publishers (the edge, actors) reuse one header record per connection or kind, so the
 * converted headers are cached per record rather than rebuilt and re-encoded for every message.
 */
const converted = new WeakMap<Headers, MsgHdrs>()
const toNatsHeaders = (h: Headers | undefined): MsgHdrs | undefined => {
  if (h === undefined) return undefined
  const cached = converted.get(h)
  if (cached !== undefined) return cached
  const out = FrozenHeaders.of(h)
  if (out !== undefined) converted.set(h, out)
  return out
}

class NatsMessage implements BusMessage {
  /** The header block as text (`NATS/1.0\r\nname: value\r\n...`), "" when there is none. */
  private head: string | undefined
  constructor(
    private readonly msg: Msg,
    readonly subject: string
  ) {}
  get data() {
    return this.msg.data
  }
  get reply() {
    return this.msg.reply || undefined
  }
  /**
   * An empty header value reads as absent: one lookup instead of `has` then `get`. Headers are
   * looked up in the raw block's text (`rawHeaderBlock`), or in nats.js's own parse without it.
   */
  header(name: string): string | undefined {
    if (this.head === undefined) {
      const head = rawHeaderBlock(this.msg)
      if (head === undefined) return nonEmpty(this.msg.headers?.get(name))
      this.head = head
    }
    // Names are ours, written as `name: value`; values never hold a line break.
    const at = this.head.indexOf(`\r\n${name}:`)
    if (at < 0) return undefined
    const from = at + name.length + 3
    return nonEmpty(this.head.slice(from, this.head.indexOf("\r\n", from)).trim())
  }
}

const nonEmpty = (value: string | undefined) => (value === undefined || value === "" ? undefined : value)


export const makeBus = ({ drain, isConnected, namespace, nc, onReconnect }: NatsLink): BusShape => {
  const prefix = `${namespace}.`
  const strip = (subject: string) => (subject.startsWith(prefix) ? subject.slice(prefix.length) : subject)
  const cork = corker(nc)

  const unsafePublish = (subject: string, data: Uint8Array | string, headers?: Headers, reply?: string) => {
    const h = toNatsHeaders(headers)
    let opts: PublishOptions | undefined
    if (h !== undefined || reply !== undefined) {
      opts = {}
      if (h !== undefined) opts.headers = h
      if (reply !== undefined) opts.reply = reply
    }
    try {
      cork()
      nc.publish(prefix + subject, toBytes(data), opts)
    } catch (cause) {
      throw busError("Publish", `publish to ${subject} failed`)(cause)
    }
  }

  const publish: BusShape["publish"] = (subject, data, headers) =>
    Effect.try({ try: () => unsafePublish(subject, data, headers), catch: (e) => (e instanceof BusError ? e : busError("Publish", subject)(e)) })

  // Not Effect.acquireRelease: one subscription per connection, whose release needs no fiber refs of its own.
  const subscribe: BusShape["subscribe"] = (subject, handler, options) =>
    acquireReleaseSync(
      Effect.try({
        try: () =>
          nc.subscribe(prefix + subject, {
            ...(options?.queue === undefined ? {} : { queue: options.queue }),
            callback: (err, msg) => {
              if (err) return
              handler(new NatsMessage(msg, strip(msg.subject)))
            }
          }),
        catch: busError("Subscribe", `subscribe to ${subject} failed`)
      }),
      (sub) => void (sub.isClosed() || sub.unsubscribe())
    ).pipe(Effect.map((sub) => ({
      drain: Effect.promise(() => (sub.isClosed() || nc.isClosed() ? Promise.resolve() : sub.drain().catch(() => undefined)))
    })))

  const stream: BusShape["stream"] = (subject, options) =>
    Stream.asyncScoped<BusMessage, BusError>((emit) => subscribe(subject, (m) => void emit.single(m), options))

  /** A request in flight: whom to tell, and of which subject. */
  interface Asked {
    readonly subject: string
    readonly timeout: Duration.DurationInput
    readonly onResult: Parameters<BusShape["unsafeRequest"]>[3]
  }
  const tell = ({ onResult, subject }: Asked, result: Either.Either<BusMessage, NoResponders | RequestTimeout | BusError>) => {
    try {
      onResult(result)
    } catch (cause) {
      // A throwing callback is a bug in its caller; as on the embedded bus, it must not end the
      // connection's read loop.
      console.error(`nats bus: the callback of a request to ${subject} threw`, cause)
    }
  }
  const requests = new NatsRequests<Asked>(nc, (asked, outcome) => {
    const { subject, timeout } = asked
    switch (outcome._tag) {
      case "Answer":
        return tell(asked, Either.right(new NatsMessage(outcome.msg, subject)))
      case "NoResponders":
        return tell(asked, Either.left(new NoResponders({ subject })))
      case "Timeout":
        return tell(asked, Either.left(new RequestTimeout({ subject, timeout: Duration.decode(timeout) })))
      case "Closed":
        return tell(asked, Either.left(new BusError({ reason: "Closed", message: `request to ${subject} failed: the connection closed` })))
    }
  })
  void nc.closed().then(() => requests.close())

  // One callback, no fiber and no promise: see NatsRequests.
  const unsafeRequest: BusShape["unsafeRequest"] = (subject, data, options, onResult) => {
    const asked: Asked = { subject, timeout: options?.timeout ?? DEFAULT_REQUEST_TIMEOUT, onResult }
    try {
      return requests.send(prefix + subject, toBytes(data), toNatsHeaders(options?.headers), Duration.toMillis(asked.timeout), asked)
    } catch (cause) {
      // As an answer would be: never while the caller is still asking.
      let live = true
      const failed = busError("Publish", `request to ${subject} failed`)(cause)
      queueMicrotask(() => live && tell(asked, Either.left(failed)))
      return () => void (live = false)
    }
  }

  const request: BusShape["request"] = (subject, data, options) =>
    Effect.async<BusMessage, NoResponders | RequestTimeout | BusError>((resume) => {
      const cancel = unsafeRequest(subject, data, options, resume)
      return Effect.sync(cancel)
    })

  const respond: BusShape["respond"] = (message, data, headers) => {
    const reply = message.reply
    if (reply === undefined) return Effect.void
    const h = toNatsHeaders(headers)
    return Effect.try({
      try: () => nc.publish(reply, data, h === undefined ? undefined : { headers: h }),
      catch: busError("Publish", "respond failed")
    })
  }

  const flush = Effect.tryPromise({ try: () => nc.flush(), catch: busError("Publish", "flush failed") })

  return {
    publish,
    unsafePublish,
    subscribe,
    stream,
    request,
    unsafeRequest,
    respond,
    flush,
    drain,
    shared: true,
    isConnected,
    onReconnect
  }
}
