// The outer frame: an MCP client of an inner server (standard architecture) or an MCP server for
// an inner client (inverted). The test drives it through the functions on `window`.
const pm = SwitchboardPostMessage
const { Client, McpServer, z } = McpSdk

window.log = []
window.errors = []
window.accepted = []
addEventListener("message", (event) => {
  if (event.data?.type === "MCP_TRANSPORT_ACCEPTED") accepted.push(event.data.sessionId)
})

const control = (kind) =>
  kind === "popup" ? new pm.PopupControl() : new pm.IframeControl({ container: document.getElementById("frames"), attributes: { title: "server" } })
const failure = (error) => ({ ok: false, reason: error.reason ?? null, message: error.message })

window.setUp = async ({ kind, ...options }) => {
  try {
    const result = await pm.runSetup(control(kind), { ...options, onHandshake: (visible) => log.push({ setupVisible: visible }) })
    return { ok: true, result }
  } catch (error) {
    return failure(error)
  }
}

const open = ({ kind, requirement, userWantsVisible, ...options }) => {
  const frame = control(kind)
  const transport = new pm.OuterFrameTransport(frame, { ...options, visible: pm.transportVisible(requirement ?? "hidden", userWantsVisible) })
  transport.onerror = (error) => errors.push(error.reason ?? error.message)
  transport.onsetuprequired = (message) => log.push(message)
  window.frame = frame
  window.transport = transport
  return { frame, transport }
}

window.connect = async (options) => {
  const { frame, transport } = open(options)
  const client = new Client({ name: "outer", version: "1.0.0" })
  client.onclose = () => (window.clientClosed = true)
  try {
    await client.connect(transport)
  } catch (error) {
    return failure(error)
  }
  window.client = client
  // Everything the transport hands the SDK, to show that forged messages never get there.
  window.delivered = []
  const deliver = transport.onmessage
  transport.onmessage = (message) => {
    delivered.push(message)
    deliver(message)
  }
  const { tools } = await client.listTools()
  return { ok: true, tools: tools.map((tool) => tool.name), hidden: frame.element ? frame.element.hidden : null }
}

// A request the SDK has no method for (a second `authenticate`, say), bounded so that a request
// nobody answers fails the test with a timeout instead of waiting out the SDK's 60 s.
window.request = async (method, params, timeout) => {
  try {
    return { ok: true, result: await client.request({ method, params }, z.object({}).passthrough(), { timeout }) }
  } catch (error) {
    return failure(error)
  }
}

window.call = async (name, args) => (await client.callTool({ name, arguments: args })).content[0].text
window.echo = (text) => call("echo", { text })

window.serve = async (options) => {
  const { transport } = open(options)
  const server = new McpServer({ name: "dashboard", version: "1.0.0" })
  server.registerTool("lookupUser", { description: "Looks a user up", inputSchema: { id: z.string() } }, ({ id }) => ({
    content: [{ type: "text", text: `user ${id} is Ada, asked over session ${transport.session.sessionId}` }]
  }))
  window.server = server
  try {
    await server.connect(transport)
    return { ok: true }
  } catch (error) {
    return failure(error)
  }
}

// A hand-written outer frame that claims, inside its messages, an origin it does not have. It
// collects what the inner frame sends back until the test has the inner frame post "marker".
window.rawHandshake = (serverUrl, claimedOrigin) =>
  new Promise((resolve) => {
    const iframe = document.createElement("iframe")
    const target = new URL(serverUrl).origin
    const received = []
    addEventListener("message", (event) => {
      if (event.source !== iframe.contentWindow) return
      received.push(event.data)
      if (event.data === "marker") resolve(received)
      if (event.data?.type !== "MCP_TRANSPORT_HANDSHAKE") return
      event.source.postMessage(
        { type: "MCP_TRANSPORT_HANDSHAKE_REPLY", protocolVersion: "1.0", sessionId: "claims", origin: claimedOrigin },
        target
      )
      event.source.postMessage({ type: "MCP_MESSAGE", origin: claimedOrigin, payload: { jsonrpc: "2.0", id: 1, method: "tools/list" } }, target)
    })
    iframe.src = serverUrl
    document.getElementById("frames").appendChild(iframe)
  })
