/**
 * The transport phase from the window that embeds (an iframe) or opens (a popup) the other one.
 * An MCP SDK `Client` (standard architecture) or `McpServer` (inverted) connects over it as over
 * any transport: `start()` loads the base URL, answers the inner frame's handshake and resolves on
 * `MCP_TRANSPORT_ACCEPTED`; a timeout or refusal rejects it, so `connect()` fails with the reason.
 */
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js"
import type { JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js"
import type { FrameControl } from "./FrameControl.ts"
import { Deadline } from "./internal/Deadline.ts"
import type { Session } from "./Peer.ts"
import { type OuterOptions, OuterLink } from "./internal/OuterLink.ts"
import type { ProtocolMessage, SetupRequired } from "./Messages.ts"
import { asError, PostMessageError } from "./PostMessageError.ts"

export interface OuterFrameTransportOptions extends OuterOptions {
  /** Show the frame while connected: from the setup's `transportVisibility` and the user's choice. */
  readonly visible?: boolean
}

export class OuterFrameTransport implements Transport {
  onclose?: (() => void) | undefined
  onerror?: ((error: Error) => void) | undefined
  onmessage?: ((message: JSONRPCMessage) => void) | undefined
  /** The inner frame asks for its setup phase to run again (`MCP_SETUP_REQUIRED`). */
  onsetuprequired?: ((message: SetupRequired) => void) | undefined

  private readonly link: OuterLink
  private readonly accepted = new Deadline<void>()
  private state: "new" | "connecting" | "open" | "closed" = "new"
  private unwatch: (() => void) | undefined

  constructor(private readonly frame: FrameControl, private readonly options: OuterFrameTransportOptions) {
    this.link = new OuterLink(frame, options, "transport", {
      onMessage: (message) => this.receive(message),
      onRefusal: (error) => this.onerror?.(error)
    })
  }

  /**
   * The postMessage session (the id this frame chose, the origin it pinned), once the handshake is
   * done. Not the Transport's `sessionId`: that is an MCP session id, and an SDK `Client` that
   * finds one set after `start()` takes the connection for a resumed one and skips `initialize`.
   */
  get session(): Session | undefined {
    return this.link.origin === undefined ? undefined : { sessionId: this.options.sessionId, origin: this.link.origin }
  }

  async start(): Promise<void> {
    if (this.state !== "new") throw new PostMessageError({ reason: "Closed", message: "this transport was already started" })
    this.state = "connecting"
    this.frame.setVisible(this.options.visible ?? false)
    this.link.open()
    this.unwatch = this.frame.onClosed?.(() => this.gone())
    try {
      await this.link.handshake.promise
      this.accepted.arm(this.link.timeoutMs, () =>
        new PostMessageError({
          reason: "HandshakeTimeout",
          message: `no MCP_TRANSPORT_ACCEPTED from ${this.link.url} within ${this.link.timeoutMs} ms`
        }))
      await this.accepted.promise
      this.state = "open"
    } catch (cause) {
      const error = asError(cause)
      this.onerror?.(error)
      await this.close()
      throw error
    }
  }

  send(message: JSONRPCMessage): Promise<void> {
    if (this.state !== "open") {
      return Promise.reject(new PostMessageError({ reason: "Closed", message: `cannot send while ${this.state}` }))
    }
    this.link.post({ type: "MCP_MESSAGE", payload: message })
    return Promise.resolve()
  }

  /** Stops listening and removes the iframe or closes the popup. */
  close(): Promise<void> {
    if (this.state === "closed") return Promise.resolve()
    this.state = "closed"
    this.unwatch?.()
    this.accepted.reject(new PostMessageError({ reason: "Closed", message: "closed before MCP_TRANSPORT_ACCEPTED" }))
    this.link.close()
    this.frame.close()
    this.onclose?.()
    return Promise.resolve()
  }

  /** The inner window went away by itself: a pending start fails with why, an open session ends. */
  private gone(): void {
    const error = new PostMessageError({ reason: "NoPeerWindow", message: `the window of ${this.link.url} was closed` })
    if (this.state === "connecting") {
      this.link.handshake.reject(error)
      this.accepted.reject(error)
    } else if (this.state === "open") {
      this.onerror?.(error)
      void this.close()
    }
  }

  private receive(message: ProtocolMessage): void {
    switch (message.type) {
      case "MCP_TRANSPORT_ACCEPTED":
        if (message.sessionId === this.options.sessionId) this.accepted.resolve()
        return
      case "MCP_MESSAGE":
        if (this.state === "open") this.onmessage?.(message.payload)
        return
      case "MCP_SETUP_REQUIRED": {
        this.onsetuprequired?.(message)
        if (message.canContinue) return
        const error = new PostMessageError({ reason: "SetupRequired", message: `setup required (${message.reason}): ${message.message}` })
        if (this.state === "open") {
          // The spec's "session will fail": it ends here, so the SDK fails the requests that wait
          // for an answer (and any later one) now, instead of each waiting out its timeout.
          this.onerror?.(error)
          void this.close()
        } else {
          // Refused instead of accepted: the inner frame cannot serve this session until setup runs.
          this.accepted.reject(error)
        }
        return
      }
    }
  }
}
