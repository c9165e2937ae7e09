/**
 * What `/embed` relays between the embedding app's MCP client and the user's `/hub` session. A
 * bridge is always a fresh MCP session, yet a client may take the postMessage connection for a
 * resumed one and never send `initialize` (the MCP SDK's `Client` does over the reference
 * implementation's transport, whose `sessionId` is set): then the bridge makes the session itself,
 * and holds the client's first messages until the hub has answered.
 */
import type { JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js"
import { ProtocolVersions } from "@switchboard/protocol/browser/Registry"

/** The id of the bridge's own `initialize`; no answer to it goes to the client. */
export const INITIALIZE_ID = "switchboard-embed-initialize"

export interface HubBridgeEnds {
  readonly toHub: (message: JSONRPCMessage) => void
  readonly toClient: (message: JSONRPCMessage) => void
}

const methodOf = (message: JSONRPCMessage): string | undefined => ("method" in message ? message.method : undefined)

export class HubBridge {
  private state: "fresh" | "initializing" | "open" = "fresh"
  private held: Array<JSONRPCMessage> = []

  constructor(private readonly ends: HubBridgeEnds, private readonly clientName: string) {}

  fromClient(message: JSONRPCMessage): void {
    if (this.state === "open") return this.ends.toHub(message)
    this.held.push(message)
    if (this.state === "initializing") return
    if (methodOf(message) === "initialize") {
      this.state = "open"
      return this.flush()
    }
    this.state = "initializing"
    this.ends.toHub({
      jsonrpc: "2.0",
      id: INITIALIZE_ID,
      method: "initialize",
      // The newest revision the hub speaks: the client said nothing, so nothing older is needed.
      params: { protocolVersion: ProtocolVersions[0], capabilities: {}, clientInfo: { name: this.clientName, version: "1.0.0" } }
    })
  }

  fromHub(message: JSONRPCMessage): void {
    if (this.state !== "initializing" || !("id" in message) || message.id !== INITIALIZE_ID) return this.ends.toClient(message)
    this.state = "open"
    if ("result" in message) {
      this.ends.toHub({ jsonrpc: "2.0", method: "notifications/initialized" })
      return this.flush()
    }
    // The hub refused the session: each held request gets that answer, and nothing goes on.
    const why = "error" in message ? message.error.message : "no answer"
    const held = this.held
    this.held = []
    for (const m of held) {
      if ("id" in m && "method" in m) {
        this.ends.toClient({
          jsonrpc: "2.0",
          id: m.id,
          error: { code: -32603, message: `Switchboard could not start an MCP session for this client, which sent ${m.method} without initialize: ${why}` }
        })
      }
    }
  }

  private flush(): void {
    const held = this.held
    this.held = []
    held.forEach((m) => this.ends.toHub(m))
  }
}
