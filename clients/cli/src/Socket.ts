/**
 * Opening a WebSocket to Switchboard, with the reasons an upgrade fails spelled out (a refused token
 * is a 401, not "Unexpected server response"), and a keepalive that notices a server that vanished
 * without closing (a laptop that slept, a dropped NAT entry): no pong by the next ping ends it.
 */
import { WebSocket } from "ws"

export interface OpenOptions {
  /** Sent as `Authorization: Bearer`, for endpoints that authenticate the upgrade. */
  readonly token?: string
  readonly protocol?: string
  readonly timeoutMillis?: number
}

const refusal = (status: number) =>
  status === 401
    ? "the token was refused (HTTP 401): check --token"
    : status === 403
      ? "the connection was refused (HTTP 403: origin not allowed)"
      : status === 503
        ? "Switchboard is shutting down or its auth is unavailable (HTTP 503)"
        : `the upgrade was refused with HTTP ${status}`

/** The server answered the upgrade with `status` rather than switching protocols. */
export class UpgradeRefused extends Error {
  constructor(readonly status: number) {
    super(refusal(status))
  }
}

/** Resolves once the socket is open; rejects with a readable reason otherwise (`UpgradeRefused` for an HTTP answer). */
export const open = (url: URL, options: OpenOptions): Promise<WebSocket> =>
  new Promise((resolve, reject) => {
    const socket = new WebSocket(url, options.protocol === undefined ? [] : [options.protocol], {
      headers: options.token === undefined ? {} : { Authorization: `Bearer ${options.token}` },
      handshakeTimeout: options.timeoutMillis ?? 10_000,
      perMessageDeflate: false,
      maxPayload: 64 * 1024 * 1024
    })
    const fail = (reason: Error) => {
      socket.removeAllListeners()
      socket.on("error", () => {})
      socket.terminate()
      reject(reason)
    }
    socket.once("open", () => {
      socket.removeAllListeners("error")
      socket.removeAllListeners("unexpected-response")
      resolve(socket)
    })
    socket.once("unexpected-response", (_request, response) => fail(new UpgradeRefused(response.statusCode ?? 0)))
    socket.once("error", (e) => fail(new Error(e.message === "" ? String(e) : e.message)))
  })

/** Pings every `intervalMillis`; a socket that did not answer the previous ping is terminated. */
export const keepAlive = (socket: WebSocket, intervalMillis = 15_000) => {
  let answered = true
  socket.on("pong", () => (answered = true))
  const timer = setInterval(() => {
    if (!answered) return socket.terminate()
    answered = false
    socket.ping()
  }, intervalMillis)
  timer.unref()
  socket.once("close", () => clearInterval(timer))
}
