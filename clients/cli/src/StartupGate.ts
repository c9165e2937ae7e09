/**
 * The host's transport, with the host's opening request held until the bridge knows whether
 * Switchboard will serve it. A refused token or a server that cannot be reached answers that request
 * with a JSON-RPC error, so a host (Claude Code's `claude mcp list`) shows the server as failed
 * instead of connected with tools that all fail. The opening request is `initialize` for a legacy
 * host and `server/discover` (or, for one that skips it, its first request) for a modern one.
 * Messages behind a held request keep their order.
 */
import {
  isJSONRPCRequest,
  type JSONRPCMessage,
  type MessageExtraInfo,
  ProtocolErrorCode,
  type Transport,
  type TransportSendOptions
} from "@modelcontextprotocol/server"

/** Resolves to why the host cannot have a session, or `undefined` when it can. */
export type Startup = () => Promise<Error | undefined>

/** The requests that open a connection in either era. */
const OPENING = new Set(["initialize", "server/discover"])

export class StartupGate implements Transport {
  onclose?: () => void
  onerror?: (error: Error) => void
  onmessage?: <T extends JSONRPCMessage>(message: T, extra?: MessageExtraInfo) => void
  private queue: Promise<void> = Promise.resolve()
  /** Set once a request went through: later ones (a modern host's, not opening) pass straight on. */
  private opened = false

  constructor(
    private readonly inner: Transport,
    private readonly startup: Startup
  ) {}

  get sessionId(): string | undefined {
    return this.inner.sessionId
  }

  setProtocolVersion(version: string): void {
    this.inner.setProtocolVersion?.(version)
  }

  start(): Promise<void> {
    this.inner.onclose = () => this.onclose?.()
    this.inner.onerror = (e) => this.onerror?.(e)
    this.inner.onmessage = (message, extra) => {
      this.queue = this.queue.then(() => this.receive(message, extra)).catch((e: unknown) => this.onerror?.(e instanceof Error ? e : new Error(String(e))))
    }
    return this.inner.start()
  }

  send(message: JSONRPCMessage, options?: TransportSendOptions): Promise<void> {
    return this.inner.send(message, options)
  }

  close(): Promise<void> {
    return this.inner.close()
  }

  private async receive(message: JSONRPCMessage, extra?: MessageExtraInfo) {
    if (isJSONRPCRequest(message) && (OPENING.has(message.method) || !this.opened)) {
      const refusal = await this.startup()
      if (refusal !== undefined) {
        return this.inner.send({ jsonrpc: "2.0", id: message.id, error: { code: ProtocolErrorCode.InternalError, message: refusal.message } })
      }
      this.opened = true
    }
    this.onmessage?.(message, extra)
  }
}
