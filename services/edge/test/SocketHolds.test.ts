/**
 * The edge's side of a hand-off alone, on the embedded bus with no socket: a hold puts the
 * envelope's marker on the connection's subject; only the release of that hand-off flushes the
 * waiting frames, and then tells a close that happened meanwhile.
 */
import { describe, expect, it } from "@effect/vitest"
import { Bus, MemoryBus, Subjects } from "@switchboard/bus"
import { Envelope } from "@switchboard/protocol"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as Queue from "effect/Queue"
import * as SocketHolds from "../src/SocketHolds.ts"

const conn = Subjects.ConnId("6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f")

/** A socket as a hold sees it, and the bus the marker goes out on, its messages in a queue. */
const setup = Effect.gen(function*() {
  const bus = Context.get(yield* Layer.build(MemoryBus.layer), Bus.Bus)
  const socket: SocketHolds.Holdable = { id: conn, subject: Subjects.conn("echo", conn), state: "open", closedWith: undefined, held: undefined, holdTimer: undefined }
  const onSubject = yield* Queue.unbounded<Either.Either<Envelope.EdgeIn, string>>()
  yield* bus.subscribe(socket.subject, (m) => void Queue.unsafeOffer(onSubject, Envelope.decodeEdgeIn(m)))
  const events: Array<string> = []
  const holds = SocketHolds.make<SocketHolds.Holdable>({
    bus,
    flush: () => void events.push("flush"),
    tellClosed: (_s, code, reason) => void events.push(`closed ${code} ${reason}`)
  })
  return { socket, holds, onSubject, events }
})

describe("the edge's hand-off holds", () => {
  it.scoped("a hold marks the connection's subject with its hand-off, and only its own release lets the frames go", () =>
    Effect.gen(function*() {
      const { events, holds, onSubject, socket } = yield* setup
      holds.hold(socket, "move-1")
      expect(yield* Queue.take(onSubject)).toStrictEqual(Either.right({ _tag: "Marker", conn, handoff: "move-1" }))
      expect(socket.held).toBe("move-1")
      holds.release(conn, "move-0")
      expect([socket.held, events]).toStrictEqual(["move-1", []])
      holds.release(conn, "move-1")
      expect([socket.held, socket.holdTimer, events]).toStrictEqual([undefined, undefined, ["flush"]])
      // Released once: a repeated release finds nothing held.
      holds.release(conn, "move-1")
      expect(events).toStrictEqual(["flush"])
    }))

  it.scoped("a socket that closed while held is told closed after its frames, on the release", () =>
    Effect.gen(function*() {
      const { events, holds, socket } = yield* setup
      holds.hold(socket, "move-2")
      socket.state = "closed"
      socket.closedWith = [1001, "going away"]
      holds.release(conn, "move-2")
      expect(events).toStrictEqual(["flush", "closed 1001 going away"])
    }))

  it.scoped("a socket still opening keeps its frames on the release: the session's start sends them", () =>
    Effect.gen(function*() {
      const { events, holds, socket } = yield* setup
      socket.state = "opening"
      holds.hold(socket, "move-3")
      holds.release(conn, "move-3")
      expect([socket.held, events]).toStrictEqual([undefined, []])
    }))
})
