/**
 * Deliveries written to sockets, with sockets that record what is done to them: a burst leaves in
 * one corked write, a lone delivery at the next microtask, and a socket whose peer does not read
 * is closed 1013 instead of buffered without limit.
 */
import { describe, expect, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import { WebSocket } from "ws"
import { EdgeMetrics } from "../src/Metrics.ts"
import * as SocketWrites from "../src/SocketWrites.ts"
import { Turn } from "../src/Turn.ts"

/** A socket that records its writes, corks and uncorks in order. */
const recording = (bufferedAmount = 0) => {
  const log: Array<string> = []
  const socket: SocketWrites.Writable = {
    state: "open",
    corked: false,
    framesOut: 0,
    ws: { readyState: WebSocket.OPEN, bufferedAmount, send: (data: unknown) => void log.push(`send ${String(data)}`) },
    raw: { cork: () => void log.push("cork"), uncork: () => void log.push("uncork") }
  }
  return { socket, log }
}

const bytes = (text: string) => new TextEncoder().encode(text)
const nextImmediate = Effect.async<void>((resume) => void setImmediate(() => resume(Effect.void)))

const setup = () => {
  const turn = new Turn()
  const metrics = new EdgeMetrics()
  const closed: Array<string> = []
  const send = SocketWrites.make<SocketWrites.Writable>({
    turn,
    metrics,
    outboundHighWaterMark: 10,
    close: (_s, code, reason) => void closed.push(`${code} ${reason}`)
  })
  return { turn, metrics, closed, send }
}

describe("the edge's socket writes", () => {
  it.live("a burst of deliveries in a busy turn is corked once and leaves in one write when the turn ends", () =>
    Effect.gen(function*() {
      const { metrics, send, turn } = setup()
      const { log, socket } = recording()
      turn.count()
      turn.count()
      send(socket, bytes("a"))
      send(socket, bytes("b"))
      yield* Effect.promise(() => Promise.resolve())
      // Still corked after the microtasks: the turn read more than one frame.
      expect(log).toStrictEqual(["cork", "send 97", "send 98"])
      yield* nextImmediate
      expect(log).toStrictEqual(["cork", "send 97", "send 98", "uncork"])
      expect([socket.corked, socket.framesOut, metrics.framesOut, metrics.bytesOut]).toStrictEqual([false, 2, 2, 2])
    }))

  it.live("a lone delivery leaves at the next microtask, not at the end of the turn", () =>
    Effect.gen(function*() {
      const { send } = setup()
      const { log, socket } = recording()
      send(socket, bytes("a"))
      yield* Effect.promise(() => Promise.resolve())
      expect(log).toStrictEqual(["cork", "send 97", "uncork"])
    }))

  it.effect("a socket over its outbound high-water mark is closed 1013 and sent nothing; a closed one is sent nothing", () =>
    Effect.sync(() => {
      const { closed, send } = setup()
      const slow = recording(8)
      send(slow.socket, bytes("abc"))
      expect([slow.log, closed]).toStrictEqual([[], ["1013 slow consumer: outbound buffer full"]])
      const gone = recording()
      send({ ...gone.socket, state: "closed" }, bytes("a"))
      expect(gone.log).toStrictEqual([])
    }))
})
