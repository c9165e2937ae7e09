/**
 * The edge's side of a hand-off (see `@switchboard/bus/Handoff`): while a connection's actor moves
 * to another replica, its frames wait here, behind a marker that ends the old owner's share, and
 * go on to the new owner on the release. The edge is the only publisher of a socket's frames, so
 * everything it sent before the marker reaches the old owner first, in a NATS cluster too.
 */
import type { Bus, Subjects } from "@switchboard/bus"
import { Envelope } from "@switchboard/protocol"
import type { EdgeSocket } from "./EdgeSocket.ts"

/**
 * A hand-off takes a round trip or two between replicas; one whose replica died midway is never
 * released, so the edge lets go of the frames itself after this long (longer than any service's
 * shutdown grace), to whoever owns the connection by then.
 */
const HOLD_LIMIT_MS = 30_000

/** What a hold reads and writes of a socket. */
export type Holdable = Pick<EdgeSocket, "id" | "subject" | "state" | "closedWith" | "held" | "holdTimer">

export interface SocketHoldsOptions<S extends Holdable> {
  readonly bus: Bus.BusShape
  /** Sends the frames that wait on, to whoever owns the connection now. */
  readonly flush: (s: S) => void
  /** Tells the connection's owner that its socket closed (while it was held). */
  readonly tellClosed: (s: S, code: number, reason: string) => void
}

export const make = <S extends Holdable>(options: SocketHoldsOptions<S>) => {
  const { bus, flush, tellClosed } = options
  /** Held sockets, closed ones included: a socket that closes while held still gets released. */
  const held = new Map<Subjects.ConnId, S>()

  /** Holds the connection's frames, and marks the end of what its current actor must handle. */
  const hold = (s: S, handoff: string) => {
    if (s.holdTimer !== undefined) clearTimeout(s.holdTimer)
    s.held = handoff
    held.set(s.id, s)
    s.holdTimer = setTimeout(() => release(s), HOLD_LIMIT_MS)
    s.holdTimer.unref()
    try {
      bus.unsafePublish(s.subject, "", Envelope.encodeEdgeIn({ _tag: "Marker", conn: s.id, handoff }))
    } catch {
      // The bus is gone: there is no hand-off to finish.
    }
  }

  /** The new actor listens: the held frames go to it, in order, then a close that happened meanwhile. */
  const release = (s: S) => {
    if (s.holdTimer !== undefined) clearTimeout(s.holdTimer)
    s.holdTimer = undefined
    s.held = undefined
    held.delete(s.id)
    if (s.state === "opening") return
    flush(s)
    if (s.state === "closed" && s.closedWith !== undefined) tellClosed(s, s.closedWith[0], s.closedWith[1])
  }

  return {
    hold,
    /** Releases the hand-off `handoff` of `conn`, if it still holds the connection (a later one may). */
    release: (conn: Subjects.ConnId, handoff: string) => {
      const s = held.get(conn)
      if (s !== undefined && s.held === handoff) release(s)
    }
  }
}
