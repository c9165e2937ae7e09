/**
 * Writes deliveries to sockets: a burst leaves in one write, and a socket whose peer does not
 * read is closed 1013 as a slow consumer instead of buffering without limit. Plain callbacks: this
 * runs once per delivery.
 */
import { Edge as EdgeProtocol } from "@switchboard/protocol"
import type { Duplex } from "node:stream"
import { WebSocket } from "ws"
import type { EdgeSocket } from "./EdgeSocket.ts"
import type { EdgeMetrics } from "./Metrics.ts"
import type { Turn } from "./Turn.ts"

/** What a write reads and writes of a socket. */
export interface Writable {
  readonly state: EdgeSocket["state"]
  readonly ws: Pick<WebSocket, "readyState" | "bufferedAmount" | "send">
  readonly raw: Pick<Duplex, "cork" | "uncork">
  corked: boolean
  framesOut: number
}

export interface SocketWritesOptions<S extends Writable> {
  readonly turn: Turn
  readonly metrics: EdgeMetrics
  /** Bytes a socket may have waiting to be written before it is closed 1013 as a slow consumer. */
  readonly outboundHighWaterMark: number
  readonly close: (s: S, code: number, reason: string) => void
}

/** `send(s, data)`: one delivery to one socket. */
export const make = <S extends Writable>(options: SocketWritesOptions<S>) => {
  const { turn, metrics, close } = options
  const hwm = options.outboundHighWaterMark

  // Deliveries arrive in bursts: one read from the bus holds many, and one turn of the event
  // loop reads many sockets. A socket is corked from its first delivery until the turn ends, so
  // that a burst leaves in one write. A turn that has read at most one frame is no burst (a lone
  // request, or a read from the bus): its writes leave once the deliveries it made are done, at
  // the next microtask checkpoint, instead of after the rest of the turn: at 1×1, 2 µs from
  // delivery to write where the end of the turn took 3.8 (instrumented all-in-one, `/hub` calls).
  const corked: Array<S> = []
  const uncorkAll = () => {
    for (const s of corked) {
      s.corked = false
      s.raw.uncork()
    }
    corked.length = 0
  }

  return (s: S, data: Uint8Array) => {
    if (s.state === "closed" || s.ws.readyState !== WebSocket.OPEN) return
    if (s.ws.bufferedAmount + data.byteLength > hwm) {
      close(s, EdgeProtocol.CloseCode.TryAgainLater, "slow consumer: outbound buffer full")
      return
    }
    metrics.framesOut++
    s.framesOut++
    metrics.bytesOut += data.byteLength
    if (!s.corked) {
      s.corked = true
      s.raw.cork()
      if (corked.push(s) === 1) {
        if (turn.frames <= 1) queueMicrotask(uncorkAll)
        else setImmediate(uncorkAll)
      }
    }
    s.ws.send(data, { binary: false })
  }
}
