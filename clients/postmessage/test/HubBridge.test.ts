/**
 * What `/embed` relays between an app's MCP client and `/hub`, as logic: the bridge's two ends are
 * recorded here. test/src/postmessage-reference.test.ts proves the same against a real hub, with
 * the reference implementation's outer frame and the SDK Client that skips `initialize`.
 */
import type { JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js"
import { describe, expect, it } from "@effect/vitest"
import { ProtocolVersions } from "@switchboard/protocol/Registry"
import { HubBridge, INITIALIZE_ID } from "../src/embed/HubBridge.ts"

const recorded = () => {
  const hub: Array<JSONRPCMessage> = []
  const client: Array<JSONRPCMessage> = []
  const bridge = new HubBridge({ toHub: (m) => hub.push(m), toClient: (m) => client.push(m) }, "Switchboard /embed for https://app.example")
  return { bridge, hub, client }
}

const listTools: JSONRPCMessage = { jsonrpc: "2.0", id: 1, method: "tools/list" }
const cancelled: JSONRPCMessage = { jsonrpc: "2.0", method: "notifications/cancelled", params: { requestId: 0 } }

describe("/embed's bridge to /hub", () => {
  it("a client that initializes is relayed as it is, both ways", () => {
    const { bridge, client, hub } = recorded()
    const initialize: JSONRPCMessage = { jsonrpc: "2.0", id: 0, method: "initialize", params: { protocolVersion: "2025-03-26", capabilities: {}, clientInfo: { name: "app", version: "1" } } }
    bridge.fromClient(initialize)
    bridge.fromClient(listTools)
    bridge.fromHub({ jsonrpc: "2.0", id: 0, result: { protocolVersion: "2025-03-26" } })
    expect(hub).toEqual([initialize, listTools])
    expect(client).toEqual([{ jsonrpc: "2.0", id: 0, result: { protocolVersion: "2025-03-26" } }])
  })

  it("a client that skips initialize: the bridge makes the session with the hub's newest revision, holding the client's messages until the hub answered", () => {
    const { bridge, client, hub } = recorded()
    bridge.fromClient(listTools)
    bridge.fromClient(cancelled)
    expect(hub).toEqual([{
      jsonrpc: "2.0",
      id: INITIALIZE_ID,
      method: "initialize",
      params: { protocolVersion: ProtocolVersions[0], capabilities: {}, clientInfo: { name: "Switchboard /embed for https://app.example", version: "1.0.0" } }
    }])
    bridge.fromHub({ jsonrpc: "2.0", id: INITIALIZE_ID, result: { protocolVersion: ProtocolVersions[0] } })
    expect(hub.slice(1)).toEqual([{ jsonrpc: "2.0", method: "notifications/initialized" }, listTools, cancelled])
    // The answer to the bridge's own initialize is not the client's.
    bridge.fromHub({ jsonrpc: "2.0", id: 1, result: { tools: [] } })
    expect(client).toEqual([{ jsonrpc: "2.0", id: 1, result: { tools: [] } }])
  })

  it("a hub that refuses the bridge's initialize: each held request is answered with an error that says so", () => {
    const { bridge, client, hub } = recorded()
    bridge.fromClient(listTools)
    bridge.fromClient(cancelled)
    bridge.fromHub({ jsonrpc: "2.0", id: INITIALIZE_ID, error: { code: -32600, message: "not authenticated" } })
    expect(hub.map((m) => ("method" in m ? m.method : undefined))).toEqual(["initialize"])
    expect(client).toEqual([{
      jsonrpc: "2.0",
      id: 1,
      error: { code: -32603, message: "Switchboard could not start an MCP session for this client, which sent tools/list without initialize: not authenticated" }
    }])
  })

  it("a hub that closes: every request it had not answered, held or relayed (initialize too), is answered with why, and so is every later one", () => {
    const { bridge, client, hub } = recorded()
    const initialize: JSONRPCMessage = { jsonrpc: "2.0", id: 0, method: "initialize", params: { protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "app", version: "1" } } }
    bridge.fromClient(initialize)
    bridge.fromClient(listTools)
    bridge.fromHub({ jsonrpc: "2.0", id: 1, result: { tools: [] } })
    bridge.fromClient({ jsonrpc: "2.0", id: "call", method: "tools/call", params: { name: "t" } })
    bridge.hubClosed("Authentication failed: token expired (1008)")
    bridge.fromClient({ jsonrpc: "2.0", id: 2, method: "ping" })
    bridge.fromClient(cancelled)
    const closed = (id: string | number) => ({
      jsonrpc: "2.0",
      id,
      error: { code: -32000, message: "Switchboard's hub closed this session: Authentication failed: token expired (1008)" }
    })
    expect(client).toEqual([{ jsonrpc: "2.0", id: 1, result: { tools: [] } }, closed(0), closed("call"), closed(2)])
    expect(hub).toHaveLength(3) // nothing goes to a closed hub
  })

  it("a hub that closes while the bridge makes the session: the held requests are answered with why", () => {
    const { bridge, client } = recorded()
    bridge.fromClient(listTools)
    bridge.fromClient(cancelled)
    bridge.hubClosed("the hub closed the connection (1006)")
    bridge.fromHub({ jsonrpc: "2.0", id: INITIALIZE_ID, result: { protocolVersion: ProtocolVersions[0] } })
    expect(client).toEqual([{ jsonrpc: "2.0", id: 1, error: { code: -32000, message: "Switchboard's hub closed this session: the hub closed the connection (1006)" } }])
  })
})
