/**
 * JSON-RPC 2.0 requests over one open WebSocket, as the MCP Proxy Protocol's client role needs them:
 * numeric ids, answers matched to requests, notifications handed on, and everything in flight
 * rejected the moment the socket closes, so no caller waits on a dead connection.
 */
import * as JsonRpc from "@switchboard/protocol/JsonRpc"
import * as Either from "effect/Either"
import type { WebSocket } from "ws"

/** An error answer from the other side (the proxy, or the extension through it). */
export class RpcError extends Error {
  constructor(
    readonly code: number,
    message: string
  ) {
    super(message)
  }
}

/** The socket closed (or was never usable) before the answer came. */
export class SocketClosed extends Error {}

/**
 * The frame as a JSON-RPC message, or undefined. Parsed without the services' depth limit: what an
 * extension answers (a page's accessibility tree) may nest deep, and this side only passes it on.
 */
const decodeIncoming = (text: string): JsonRpc.Incoming | undefined => {
  let raw: unknown
  try {
    raw = JSON.parse(text)
  } catch {
    return undefined
  }
  return Either.getOrUndefined(JsonRpc.decodeValue(raw))
}

interface Pending {
  readonly resolve: (result: unknown) => void
  readonly reject: (e: Error) => void
}

export interface RequestOptions {
  readonly signal?: AbortSignal
  readonly timeoutMillis?: number
}

export class JsonRpcSocket {
  private nextId = 1
  private readonly pending = new Map<number, Pending>()
  /** Settles with the close reason when the socket closes. */
  readonly closed: Promise<string>

  constructor(
    private readonly socket: WebSocket,
    onNotification: (method: string, params: unknown) => void
  ) {
    this.closed = new Promise((resolve) =>
      socket.once("close", (code, reason) => {
        const why = `closed ${code}${reason.length > 0 ? ` ${reason.toString()}` : ""}`
        for (const p of this.pending.values()) p.reject(new SocketClosed(why))
        this.pending.clear()
        resolve(why)
      })
    )
    socket.on("error", () => {}) // the close that follows says what happened
    socket.on("message", (data) => {
      const decoded = decodeIncoming(data.toString())
      if (decoded === undefined) return
      if (decoded._tag !== "Response") return onNotification(decoded.message.method, decoded.message.params)
      const m = decoded.message
      if (typeof m.id !== "number") return
      const p = this.pending.get(m.id)
      if (p === undefined) return // late: cancelled or timed out here
      this.pending.delete(m.id)
      if ("error" in m) p.reject(new RpcError(m.error.code, m.error.message))
      else p.resolve(m.result)
    })
  }

  request(method: string, params: object, options: RequestOptions = {}): Promise<unknown> {
    if (this.socket.readyState !== this.socket.OPEN) return Promise.reject(new SocketClosed("not open"))
    const id = this.nextId++
    return new Promise<unknown>((resolve, reject) => {
      const timer =
        options.timeoutMillis === undefined
          ? undefined
          : setTimeout(() => settle(() => reject(new RpcError(JsonRpc.ErrorCode.ServerError1, `${method}: no answer within ${options.timeoutMillis} ms`))), options.timeoutMillis)
      const onAbort = () => settle(() => reject(new RpcError(JsonRpc.ErrorCode.RequestCancelled, `${method}: cancelled`)))
      const settle = (then: () => void) => {
        this.pending.delete(id)
        if (timer !== undefined) clearTimeout(timer)
        options.signal?.removeEventListener("abort", onAbort)
        then()
      }
      if (options.signal?.aborted === true) return onAbort()
      options.signal?.addEventListener("abort", onAbort, { once: true })
      this.pending.set(id, { resolve: (r) => settle(() => resolve(r)), reject: (e) => settle(() => reject(e)) })
      this.socket.send(JsonRpc.request(id, method, params))
    })
  }

  close(): void {
    this.socket.close(1000)
  }
}
