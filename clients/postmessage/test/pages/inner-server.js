// An MCP server in an inner frame (standard architecture). Setup (#setup) stores a token per
// asking origin and session id, silently or through a visible form; the transport phase serves an
// `echo` tool that says which token, origin and session it runs under, or asks for setup when
// none is stored. Query: allow (comma-separated origins), visibleSetup=1, visibility, timeout.
const pm = SwitchboardPostMessage
const { McpServer, z } = McpSdk
const query = new URLSearchParams(location.search)
const allowedOrigins = (query.get("allow") ?? "").split(",")
const handshakeTimeoutMs = Number(query.get("timeout") ?? 10000)
const requirement = query.get("visibility") ?? "hidden"
const key = (origin, sessionId) => `echo-token ${origin} ${sessionId}`

window.events = []
window.replies = []
window.calls = []
const note = (error) => events.push(error.reason ?? error.message)
addEventListener("message", (event) => {
  if (event.data?.type === "MCP_TRANSPORT_HANDSHAKE_REPLY") replies.push(event.data.sessionId)
})

if (pm.isSetupPhase()) {
  const requiresVisibleSetup = query.get("visibleSetup") === "1"
  const setup = new pm.InnerFrameSetup({ allowedOrigins, requiresVisibleSetup, handshakeTimeoutMs })
  setup.handshake().then(({ origin, sessionId }) => {
    const finish = (token) => {
      localStorage.setItem(key(origin, sessionId), token)
      return setup.complete({
        serverTitle: `Echo (${token})`,
        transportVisibility: requirement === "optional" ? { requirement, optionalMessage: "Show the echo log" } : { requirement },
        ephemeralMessage: "Saved"
      })
    }
    if (!requiresVisibleSetup) return finish("automatic")
    document.body.insertAdjacentHTML("beforeend", `<form id="setup"><p>Asking: <b id="asking"></b></p>
      <input id="token"><button id="save" type="button">Save</button><button id="cancel" type="button">Cancel</button></form>`)
    document.getElementById("asking").textContent = origin
    document.getElementById("save").onclick = () => finish(document.getElementById("token").value)
    document.getElementById("cancel").onclick = () => setup.fail("USER_CANCELLED", "the user cancelled")
  }).catch(note)
} else {
  const transport = new pm.InnerFrameTransport({ allowedOrigins, handshakeTimeoutMs })
  transport.onerror = note
  window.transport = transport
  transport.handshake().then(async ({ origin, sessionId }) => {
    const token = localStorage.getItem(key(origin, sessionId))
    if (token === null) {
      return transport.requireSetup({ reason: "AUTH_EXPIRED", message: "no token for this session", canContinue: false })
    }
    const server = new McpServer({ name: "echo", version: "1.0.0" })
    server.registerTool("echo", { description: "Echoes text", inputSchema: { text: z.string() } }, ({ text }) => {
      calls.push(text)
      return { content: [{ type: "text", text: `${text} | token ${token} | from ${origin} | session ${sessionId}` }] }
    })
    window.server = server
    await server.connect(transport)
  }).catch(note)
}
