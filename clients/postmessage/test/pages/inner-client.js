// An MCP client in an inner frame (inverted architecture): it connects to the outer frame's
// server, lists its tools and calls one; `window.done` is what it saw, or why it failed.
// Query: allow (comma-separated origins), timeout.
const pm = SwitchboardPostMessage
const { Client } = McpSdk
const query = new URLSearchParams(location.search)
const allowedOrigins = (query.get("allow") ?? "").split(",")
const handshakeTimeoutMs = Number(query.get("timeout") ?? 10000)

window.done = (async () => {
  if (pm.isSetupPhase()) {
    const setup = new pm.InnerFrameSetup({ allowedOrigins, requiresVisibleSetup: false, handshakeTimeoutMs })
    await setup.handshake()
    await setup.complete({ serverTitle: "Copilot", transportVisibility: { requirement: "required" } })
    return { ok: true, phase: "setup" }
  }
  const transport = new pm.InnerFrameTransport({ allowedOrigins, handshakeTimeoutMs })
  const client = new Client({ name: "copilot", version: "1.0.0" })
  try {
    await client.connect(transport)
  } catch (error) {
    return { ok: false, reason: error.reason ?? null, message: error.message }
  }
  const { tools } = await client.listTools()
  const result = await client.callTool({ name: "lookupUser", arguments: { id: "42" } })
  return { ok: true, tools: tools.map((tool) => tool.name), text: result.content[0].text, session: transport.session }
})()
