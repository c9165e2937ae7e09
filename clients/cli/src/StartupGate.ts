/**
 * The host's transport, with its `initialize` held until the bridge knows whether Switchboard will
 * serve it. A refused token or a server that cannot be reached answers the initialize with a
 * JSON-RPC error, so a host (Claude Code's `claude mcp list`) shows the server as failed instead
 * of connected with tools that all fail. Messages behind a held initialize keep their order.
 */
import type { Transport, TransportSendOptions } from "@modelcontextprotocol/sdk/shared/transport.js"
import { ErrorCode, isJSONRPCRequest, type JSONRPCMessage, type MessageExtraInfo } from "@modelcontextprotocol/sdk/types.js"

/** Resolves to why the host cannot have a session, or `undefined` when it can. */
export type Startup = () => Promise<Error | undefined>

export class StartupGate implements Transport {
  onclose?: () => void
  onerror?: (error: Error) => void
  onmessage?: (message: JSONRPCMessage, extra?: MessageExtraInfo) => void
  private queue: Promise<void> = Promise.resolve()

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
    if (isJSONRPCRequest(message) && message.method === "initialize") {
      const refusal = await this.startup()
      if (refusal !== undefined) {
        return this.inner.send({ jsonrpc: "2.0", id: message.id, error: { code: ErrorCode.InternalError, message: refusal.message } })
      }
    }
    this.onmessage?.(message, extra)
  }
}
