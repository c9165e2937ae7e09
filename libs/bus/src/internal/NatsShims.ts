/**
 * The places where the NATS adapter relies on nats.js internals, each named and each with the
 * shape it needs stated in `shapes`, which `test/NatsShims.test.ts` checks against a real server:
 * a nats.js upgrade that moves any of them fails that test rather than silently losing the shim.
 * The nats.js packages are pinned to an exact version for the same reason. Every shim falls back
 * to nats.js's public behaviour when the shape is missing.
 */
import { TE } from "@nats-io/nats-core/internal"
import { canonicalMIMEHeaderKey, type Msg, MsgHdrsImpl, type NatsConnection } from "@nats-io/transport-node"
import { Socket } from "node:net"

/**
 * nats.js encodes every protocol line it writes (`HPUB <subject> ...`) with one shared
 * TextEncoder, whose `encode()` allocates a new ArrayBuffer per call. `Buffer.from` takes short
 * strings from Node's pooled slab instead. Same bytes, and a Buffer is a Uint8Array.
 */
export const installPooledEncoder = () => {
  if (TE instanceof TextEncoder) TE.encode = (input = "") => Buffer.from(input)
}

/**
 * Headers that never change once built, so their wire form is made once, not per publish: hot
 * publishers reuse one header record per connection or kind. They keep only that wire form, as
 * text, since nats.js reads nothing but `encode()` of the headers it publishes, and each publish
 * encodes it into Node's pooled slab, as nats.js does its protocol line. Built straight from the
 * record: nats.js's `set` (a key search, a canonical name, a Map of arrays) was 3 KB of garbage
 * per connection, and the typed array each kept was three times the text (issue 29).
 */
export class FrozenHeaders extends MsgHdrsImpl {
  /** The headers of `record` as nats.js would write them; undefined when there are none. */
  static of(record: Readonly<Record<string, string>>): FrozenHeaders | undefined {
    const lines = ["NATS/1.0"]
    for (const name in record) {
      // nats.js's own checks, as its `append` makes them: a name or value that would break the
      // header block throws; a value is trimmed.
      canonicalMIMEHeaderKey(name)
      lines.push(`${name}: ${MsgHdrsImpl.validHeaderValue(record[name]!)}`)
    }
    if (lines.length === 1) return undefined
    // Joined, with the blank line that ends the block, so that the text is one flat string and
    // not a tree of its parts.
    lines.push("", "")
    return new FrozenHeaders(lines.join("\r\n"))
  }

  private constructor(private readonly wire: string) {
    super()
    this.headers = frozen
  }
  override encode(): Uint8Array {
    return Buffer.from(this.wire)
  }
  override set(..._args: Parameters<MsgHdrsImpl["set"]>): void {
    throw new Error("frozen headers cannot change")
  }
  override append(..._args: Parameters<MsgHdrsImpl["append"]>): void {
    throw new Error("frozen headers cannot change")
  }
}
/** What every frozen header set reads as: nothing is set on it. */
const frozen: Map<string, Array<string>> = new Map()

/** What nats.js keeps of a received message before it parses anything. */
interface RawMsg {
  readonly _rdata?: Uint8Array
  readonly _msg?: { readonly hdr?: number }
}

const headerDecoder = new TextDecoder()

/**
 * A received message's header block as text (`NATS/1.0\r\nname: value\r\n...`), "" when it has
 * none, read from the raw bytes nats.js keeps: its own parse builds a Map of arrays per message,
 * where the hot paths read two or three headers. `undefined` when the raw bytes are not there.
 */
export const rawHeaderBlock = (msg: Msg): string | undefined => {
  const raw = msg as unknown as RawMsg
  const end = raw._msg?.hdr
  if (raw._rdata === undefined || end === undefined) return undefined
  return end > 0 ? headerDecoder.decode(raw._rdata.subarray(0, end)) : ""
}

/** The connection's own socket, or `undefined` when nats.js keeps it elsewhere. */
const socketOf = (nc: NatsConnection): Socket | undefined => {
  const socket = (nc as unknown as { readonly protocol?: { readonly transport?: { readonly socket?: unknown } } }).protocol?.transport?.socket
  return socket instanceof Socket ? socket : undefined
}

/**
 * nats.js writes what one microtask published with one socket write, so a busy process that
 * handles one socket read per task made one write (a syscall) per frame. Corking the connection's
 * socket gathers those writes into one writev. The cork lasts the turn of the event loop that
 * wrote and the next one: a busy process reads more frames in that turn and their writes join the
 * same flush; an idle one goes through it at once (pending immediates make the poll not wait).
 * Nothing is reordered: every write of the connection goes through the one socket. Returns the
 * function to call before each publish.
 */
export const corker = (nc: NatsConnection) => {
  let corked = false
  let turns = 0
  const uncork = (socket: Socket) => {
    if (++turns < 2) return void setImmediate(uncork, socket)
    corked = false
    socket.uncork()
  }
  return () => {
    if (corked) return
    const socket = socketOf(nc)
    if (socket === undefined || socket.destroyed) return
    corked = true
    turns = 0
    socket.cork()
    setImmediate(uncork, socket)
  }
}

/**
 * The consumer behind a KV watch (`kv.watch()` keeps it on its iterator), so that the watch can
 * ask whether it still exists. A KV watch is an ordered push consumer with a 30 s idle heartbeat:
 * when the node that held it dies, nats.js makes a new one only after two missed heartbeats, and
 * the watch says nothing for that minute. `undefined` when nats.js keeps it elsewhere.
 */
export const watchConsumer = (watch: unknown): { readonly info: () => Promise<unknown> } | undefined => {
  const consumer = (watch as { readonly _data?: { readonly info?: unknown } } | undefined)?._data
  const info = consumer?.info
  return typeof info === "function" ? { info: () => (info as () => Promise<unknown>).call(consumer) } : undefined
}

/** Whether each internal a shim relies on is where it expects, on a live connection that has received `msg`, and a KV watch. */
export const shapes = (nc: NatsConnection, msg: Msg, watch: unknown) => ({
  pooledEncoder: TE instanceof TextEncoder,
  frozenHeaders: typeof MsgHdrsImpl === "function" && typeof MsgHdrsImpl.prototype.encode === "function",
  rawHeaderBlock: rawHeaderBlock(msg) !== undefined,
  corker: socketOf(nc) !== undefined,
  watchConsumer: watchConsumer(watch) !== undefined
})
