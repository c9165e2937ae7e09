/**
 * MCP over WebSocket (subprotocol `mcp`, text frames) as an SDK client `Transport`, on `ws`. The
 * SDK's own WebSocketClientTransport needs a global WebSocket (absent in Node 20) and can only put
 * the token in the URL; this one sends it as `Authorization: Bearer`, which stays out of logs.
 */
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js"
import { type JSONRPCMessage, JSONRPCMessageSchema } from "@modelcontextprotocol/sdk/types.js"
import type { WebSocket } from "ws"
import * as Socket from "./Socket.ts"

export class HubTransport implements Transport {
  onclose?: () => void
  onerror?: (error: Error) => void
  onmessage?: (message: JSONRPCMessage) => void

  private constructor(private readonly socket: WebSocket) {}

  /** Opens the socket; the SDK's `Client.connect` then starts the transport and initializes. */
  static async open(url: URL, token: string): Promise<HubTransport> {
    const socket = await Socket.open(url, { token, protocol: "mcp" })
    Socket.keepAlive(socket)
    return new HubTransport(socket)
  }

  async start(): Promise<void> {
    this.socket.on("message", (data, isBinary) => {
      if (isBinary) return this.onerror?.(new Error("the hub sent a binary frame; MCP over WebSocket uses text frames"))
      let message: JSONRPCMessage
      try {
        message = JSONRPCMessageSchema.parse(JSON.parse(data.toString()))
      } catch (e) {
        return this.onerror?.(e instanceof Error ? e : new Error(String(e)))
      }
      this.onmessage?.(message)
    })
    this.socket.on("error", (e) => this.onerror?.(e))
    this.socket.once("close", () => this.onclose?.())
    if (this.socket.readyState !== this.socket.OPEN) throw new Error("the hub closed the connection as it opened")
  }

  async send(message: JSONRPCMessage): Promise<void> {
    if (this.socket.readyState !== this.socket.OPEN) throw new Error("the hub connection is closed")
    this.socket.send(JSON.stringify(message))
  }

  async close(): Promise<void> {
    this.socket.close(1000)
  }
}
