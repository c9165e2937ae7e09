/**
 * One accepted WebSocket as the edge keeps it, from its open to its close: its state, the frames
 * that wait while its session starts or moves, and how the edge closes it. Shared by the socket
 * I/O's parts (`Sockets.ts`, `SocketWrites.ts`, `SocketHolds.ts`), which each own a part of it.
 */
import type { RateBudget, Subjects } from "@switchboard/bus"
import { Edge as EdgeProtocol, type Envelope } from "@switchboard/protocol"
import type { Duplex } from "node:stream"
import { WebSocket } from "ws"
import type { Route } from "./Routes.ts"

export interface EdgeSocket {
  readonly id: Subjects.ConnId
  readonly ws: EdgeWebSocket
  /** The peer's address, for logs. */
  readonly remote: string
  /** The TCP socket under `ws`, corked while a burst of deliveries is written. */
  readonly raw: Duplex
  corked: boolean
  readonly path: string
  readonly route: Route
  readonly subject: string
  /** The headers of this socket's frames (`frameOf`), built once. */
  readonly frameHeaders: Envelope.Headers
  /** `frameHeaders` marked rate-limited, made the first time the socket goes over its rate. */
  limitedHeaders: Envelope.Headers | undefined
  readonly budget: RateBudget
  state: "opening" | "open" | "closed"
  /** Frames that arrived before the service took the connection, or while it is held. */
  pending: Array<readonly [Buffer, boolean]>
  /**
   * The hand-off (its token) that holds this connection's frames: its actor moves to another
   * replica, and frames wait here until it listens (see `@switchboard/bus/Handoff`).
   */
  held: string | undefined
  holdTimer: ReturnType<typeof setTimeout> | undefined
  closedWith: readonly [number, string] | undefined
  alive: boolean
  /**
   * The code and reason the edge (or ws, for a frame it refused) closed with, when it closed
   * first: what the metrics count and the service is told, since the peer's own close may never
   * come (a peer that stops reading is terminated, and shows up as 1006).
   */
  sentClose: readonly [number, string] | undefined
  /** Terminates a peer that does not answer the edge's close; cleared once the socket is closed. */
  closeTimer: ReturnType<typeof setTimeout> | undefined
  /** For the access log's close line. */
  readonly openedAt: number
  readonly user: string | undefined
  framesIn: number
  framesOut: number
}

export const MAX_PENDING_FRAMES = 1024

/** What the socket I/O does with its sockets' events: one set of handlers for every socket. */
export interface SocketEvents {
  readonly close: (s: EdgeSocket, code: number, reason: Buffer) => void
  readonly message: (s: EdgeSocket, data: Buffer, isBinary: boolean) => void
  readonly pong: (s: EdgeSocket) => void
  readonly error: (s: EdgeSocket, e: Error & { readonly code?: string }) => void
}

/**
 * The WebSocket that ws makes for every socket the edge accepts (`WebSocketServer`'s `WebSocket`
 * option). ws tells a socket's events through `emit`; once the socket I/O has taken the socket
 * (`take`), its close, frames, pongs and errors go to the I/O's handlers first, then to any
 * listener. A listener per event on every socket kept a dictionary of them for the socket's whole
 * life, with a map from ws to socket beside it: about 0.3 KB of each idle socket's live heap, in a
 * sampling profile of a distributed edge's `/tabs` (issue 29).
 */
export class EdgeWebSocket extends WebSocket {
  private socket: EdgeSocket | undefined = undefined
  private events: SocketEvents | undefined = undefined

  /** From here on, this socket's events go to `events`, with `socket`. */
  take(socket: EdgeSocket, events: SocketEvents) {
    this.socket = socket
    this.events = events
  }

  override emit(event: string | symbol, a?: unknown, b?: unknown): boolean {
    const s = this.socket
    const events = this.events
    if (s !== undefined && events !== undefined) {
      switch (event) {
        case "message":
          events.message(s, a as Buffer, b as boolean)
          break
        case "pong":
          events.pong(s)
          break
        case "close":
          // A socket closes once; it holds nothing of the I/O's after that.
          this.socket = undefined
          events.close(s, a as number, b as Buffer)
          break
        case "error":
          events.error(s, a as Error)
          // Handled: without a listener of its own, an emitted error would throw.
          if (this.listenerCount("error") === 0) return true
      }
    }
    return super.emit(event, a, b)
  }
}

/**
 * A close frame holds at most 123 bytes of reason, and ws throws on more. Services word reasons
 * freely (an auth error's text, a parse error's message), so a long one is cut here, on whole
 * characters, to 120 bytes and an ellipsis.
 */
export const fitCloseReason = (reason: string) => {
  if (Buffer.byteLength(reason) <= 123) return reason
  let cut = reason.slice(0, 120)
  while (Buffer.byteLength(cut) > 120) cut = cut.slice(0, -1)
  return `${cut}...`
}

/**
 * The envelope of a socket's frames: built for its headers, once, and again only for a frame that
 * is rate-limited or traced. Not kept: the socket keeps the headers, and the envelope was one more
 * object for its whole life (issue 29).
 */
export const frameOf = (conn: Subjects.ConnId, edge: Subjects.EdgeId, user: string | undefined, limited: boolean, traceparent?: string): Envelope.Frame => {
  const frame: { -readonly [K in keyof Envelope.Frame]: Envelope.Frame[K] } = { _tag: "Frame", conn, edge, limited }
  if (user !== undefined) frame.user = user
  if (traceparent !== undefined) frame.traceparent = traceparent
  return frame
}

export const socketLog = (s: EdgeSocket) => ({ conn: s.id, path: s.path, remote: s.remote })

/**
 * Closes the socket with `code` and `reason` (once), and terminates it after `graceMs` if its
 * peer does not answer the close.
 */
export const closeSocket = (s: EdgeSocket, code: number, reason: string, graceMs: number) => {
  if (s.ws.readyState === WebSocket.CLOSING || s.ws.readyState === WebSocket.CLOSED) return
  try {
    s.ws.close(code, fitCloseReason(reason))
    s.sentClose = [code, reason]
  } catch {
    // A code no close frame may carry (a service's bug: 1005, 999): the socket still closes.
    s.ws.close(EdgeProtocol.CloseCode.InternalError, `invalid close code ${code}`)
    s.sentClose = [EdgeProtocol.CloseCode.InternalError, `invalid close code ${code}`]
  }
  // A peer that does not read will never see the close frame; don't wait on it for long.
  s.closeTimer = setTimeout(() => s.ws.terminate(), graceMs)
  s.closeTimer.unref()
}
