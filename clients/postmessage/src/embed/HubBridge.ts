/**
 * What `/embed` relays between the embedding app's MCP client and the user's `/hub` session. A
 * bridge is always a fresh MCP session, yet a client may take the postMessage connection for a
 * resumed one and never send `initialize` (the MCP SDK's `Client` does over the reference
 * implementation's transport, whose `sessionId` is set): then the bridge makes the session itself,
 * and holds the client's first messages until the hub has answered. A hub that closes leaves no
 * request of the client waiting: each one it had not answered, and each later one, is answered
 * with why, since nothing in the postMessage transport tells the client that a frame stopped.
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
type Id = string | number
/** The id of a request; undefined for a notification or an answer. */
const requestId = (message: JSONRPCMessage): Id | undefined => ("method" in message && "id" in message ? message.id : undefined)
/** The id a response answers; undefined for a request or a notification. */
const answeredId = (message: JSONRPCMessage): Id | undefined => (!("method" in message) && "id" in message ? message.id : undefined)

export class HubBridge {
  private state: "fresh" | "initializing" | "open" | "closed" = "fresh"
  private held: Array<JSONRPCMessage> = []
  /** The client's requests relayed to the hub and not answered yet, in the order they went. */
  private readonly unanswered = new Set<Id>()
  private closedBecause = ""

  constructor(private readonly ends: HubBridgeEnds, private readonly clientName: string) {}

  fromClient(message: JSONRPCMessage): void {
    if (this.state === "closed") return this.answerClosed(requestId(message))
    if (this.state === "open") return this.relay(message)
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
    if (this.state === "closed") return
    if (this.state !== "initializing" || !("id" in message) || message.id !== INITIALIZE_ID) {
      const id = answeredId(message)
      if (id !== undefined) this.unanswered.delete(id)
      return this.ends.toClient(message)
    }
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

  /**
   * The hub's socket closed, `why` being its reason: the requests it will never answer (held or
   * relayed) are answered now, and every later one at once, instead of each waiting out the
   * client's own timeout.
   */
  hubClosed(why: string): void {
    if (this.state === "closed") return
    this.state = "closed"
    this.closedBecause = why
    const waiting = [...this.unanswered, ...this.held.map(requestId)]
    this.unanswered.clear()
    this.held = []
    waiting.forEach((id) => this.answerClosed(id))
  }

  private answerClosed(id: Id | undefined): void {
    if (id === undefined) return
    this.ends.toClient({ jsonrpc: "2.0", id, error: { code: -32000, message: `Switchboard's hub closed this session: ${this.closedBecause}` } })
  }

  private relay(message: JSONRPCMessage): void {
    const id = requestId(message)
    if (id !== undefined) this.unanswered.add(id)
    this.ends.toHub(message)
  }

  private flush(): void {
    const held = this.held
    this.held = []
    held.forEach((m) => this.relay(m))
  }
}
