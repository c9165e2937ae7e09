/**
 * The transport phase from the embedded window (iframe or popup). An MCP SDK `McpServer`
 * (standard architecture) or `Client` (inverted) connects over it unchanged. `start()` announces
 * the frame, pins the outer origin from the reply and sends `MCP_TRANSPORT_ACCEPTED`. Call
 * `handshake()` first to learn the session id and origin before accepting (to load what setup
 * stored for them); `start()` reuses that handshake.
 */
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js"
import type { JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js"
import { type InnerOptions, InnerLink } from "./internal/InnerLink.ts"
import type { Session } from "./Peer.ts"
import * as Messages from "./Messages.ts"
import { asError, PostMessageError } from "./PostMessageError.ts"

export type InnerFrameTransportOptions = InnerOptions

export class InnerFrameTransport implements Transport {
  onclose?: (() => void) | undefined
  onerror?: ((error: Error) => void) | undefined
  onmessage?: ((message: JSONRPCMessage) => void) | undefined
  /**
   * The postMessage session, once the handshake is done. Not the Transport's `sessionId`: that is
   * an MCP session id, and an SDK `Client` that finds one set after `start()` skips `initialize`.
   */
  session?: Session | undefined

  private readonly link: InnerLink
  private state: "new" | "open" | "closed" = "new"

  constructor(options: InnerFrameTransportOptions) {
    this.link = new InnerLink(options, "transport", {
      onMessage: (message) => {
        if (message.type === "MCP_MESSAGE" && this.state === "open") this.onmessage?.(message.payload)
      },
      onRefusal: (error) => this.onerror?.(error),
      refusal: (origin) => ({
        type: "MCP_SETUP_REQUIRED",
        reason: "PERMISSIONS_CHANGED",
        message: `${origin} is not allowed to use this server`,
        canContinue: false
      })
    })
  }

  /** The handshake without the accept: who is asking, under which session id. */
  async handshake(): Promise<Session> {
    const session = await this.link.run({ type: "MCP_TRANSPORT_HANDSHAKE", protocolVersion: Messages.PROTOCOL_VERSION })
    this.session = session
    return session
  }

  async start(): Promise<void> {
    if (this.state !== "new") throw new PostMessageError({ reason: "Closed", message: "this transport was already started" })
    try {
      const { sessionId } = await this.handshake()
      this.link.post({ type: "MCP_TRANSPORT_ACCEPTED", sessionId })
      this.state = "open"
    } catch (cause) {
      const error = asError(cause)
      this.onerror?.(error)
      await this.close()
      throw error
    }
  }

  /**
   * Tells the outer frame to run setup again. Before `start()`, with `canContinue: false`, it is
   * the refusal of a session this frame cannot serve (no stored credentials for it).
   */
  async requireSetup(request: Omit<Messages.SetupRequired, "type">): Promise<void> {
    await this.handshake()
    this.link.post({ type: "MCP_SETUP_REQUIRED", ...request })
  }

  send(message: JSONRPCMessage): Promise<void> {
    if (this.state !== "open") {
      return Promise.reject(new PostMessageError({ reason: "Closed", message: `cannot send while ${this.state}` }))
    }
    this.link.post({ type: "MCP_MESSAGE", payload: message })
    return Promise.resolve()
  }

  close(): Promise<void> {
    if (this.state === "closed") return Promise.resolve()
    this.state = "closed"
    this.link.close()
    this.onclose?.()
    return Promise.resolve()
  }
}
