/**
 * The script of Switchboard's `/embed` page: an inner frame of the postMessage transport that
 * carries MCP between the embedding app and the user's `/hub` session, so the app sees the
 * registry's MCP server (every tool of every tab of the user) as is. The setup phase asks the
 * user for a token, showing which origin asks; it is stored per outer origin and session id, and
 * the transport phase uses it without asking. The edge serves this page with a CSP and the allowed
 * outer origins in a `<meta>` tag; nothing secret is in the page.
 */
import { InnerFrameSetup } from "../InnerFrameSetup.ts"
import { InnerFrameTransport } from "../InnerFrameTransport.ts"
import { isSetupPhase } from "../internal/Phases.ts"
import type { Session } from "../Peer.ts"
import { JsonRpcMessage } from "../Messages.ts"
import { asError } from "../PostMessageError.ts"
import { HubBridge } from "./HubBridge.ts"
import * as Schema from "effect/Schema"

/** The meta tag through which the edge names the outer origins it allows (space-separated). */
export const ORIGINS_META = "switchboard-embed-origins"
const AUTHENTICATE_ID = "switchboard-embed-authenticate"
const isJsonRpcMessage = Schema.is(JsonRpcMessage)

const byId = (id: string): HTMLElement => {
  const found = document.getElementById(id)
  if (found === null) throw new Error(`the /embed page has no #${id}`)
  return found
}

const allowedOrigins = (): ReadonlyArray<string> =>
  (document.querySelector(`meta[name="${ORIGINS_META}"]`)?.getAttribute("content") ?? "").split(/\s+/).filter((o) => o.length > 0)

const tokenKey = ({ origin, sessionId }: Session) => `switchboard-embed-token ${origin} ${sessionId}`

/**
 * The token lives in localStorage, which a browser may deny an iframe embedded by another site
 * (third-party storage blocked, as Chromium launched by Playwright does). A popup is a first-party
 * window, so the same app can still use Switchboard through one.
 */
const STORAGE_BLOCKED = "this browser does not let Switchboard keep its token when another site embeds it in a frame " +
  "(third-party storage is blocked): open it in a popup instead"

const storedToken = (session: Session): string | null => {
  try {
    return localStorage.getItem(tokenKey(session))
  } catch {
    throw new Error(STORAGE_BLOCKED)
  }
}

const storeToken = (session: Session, token: string): void => {
  try {
    localStorage.setItem(tokenKey(session), token)
  } catch {
    throw new Error(STORAGE_BLOCKED)
  }
}

const hubUrl = (): string => {
  const url = new URL("/hub", location.href)
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:"
  return url.href
}

const parse = (text: unknown): unknown => {
  try {
    return typeof text === "string" ? JSON.parse(text) : undefined
  } catch {
    return undefined
  }
}

/**
 * A `/hub` session authenticated in-band (the token never goes into a URL); resolves once the
 * registry accepted the token, rejects with its reason.
 */
const openHub = (token: string): Promise<WebSocket> =>
  new Promise((resolve, reject) => {
    const socket = new WebSocket(hubUrl(), "mcp")
    socket.onopen = () => socket.send(JSON.stringify({ jsonrpc: "2.0", id: AUTHENTICATE_ID, method: "authenticate", params: { token } }))
    socket.onmessage = (event) => {
      const answer = parse(event.data)
      if (typeof answer !== "object" || answer === null || !("id" in answer) || answer.id !== AUTHENTICATE_ID) return
      socket.onmessage = null
      socket.onclose = null
      if ("result" in answer) resolve(socket)
      else reject(new Error("the hub refused the token"))
    }
    socket.onclose = (event) => reject(new Error(event.reason.length > 0 ? event.reason : `the hub closed the connection (${event.code})`))
  })

const runSetupPhase = async () => {
  const setup = new InnerFrameSetup({ allowedOrigins: allowedOrigins(), requiresVisibleSetup: true })
  let session: Session
  try {
    session = await setup.handshake()
  } catch (error) {
    const refused = byId("refused")
    refused.textContent = asError(error).message
    refused.hidden = false
    console.warn("switchboard /embed: setup refused:", refused.textContent)
    return
  }
  byId("asking").textContent = session.origin
  byId("setup").hidden = false
  const status = byId("status")
  const token = byId("token") as HTMLInputElement
  byId("allow").onclick = async () => {
    status.textContent = "Checking the token…"
    try {
      storedToken(session)
    } catch (error) {
      status.textContent = asError(error).message
      return setup.fail("CONFIG_ERROR", status.textContent)
    }
    try {
      const socket = await openHub(token.value)
      socket.close(1000)
      storeToken(session, token.value)
      await setup.complete({ serverTitle: "Switchboard", transportVisibility: { requirement: "hidden" }, ephemeralMessage: "Switchboard connected" })
      status.textContent = `Connected: ${session.origin} can use your Switchboard tools.`
    } catch (error) {
      status.textContent = `Not connected: ${asError(error).message}`
    }
  }
  byId("cancel").onclick = () => void setup.fail("USER_CANCELLED", "the user cancelled")
}

const runTransportPhase = async () => {
  const transport = new InnerFrameTransport({ allowedOrigins: allowedOrigins() })
  transport.onerror = (error) => console.warn("switchboard /embed:", error.message)
  let session: Session
  try {
    session = await transport.handshake()
  } catch {
    return // refused or timed out; onerror said why
  }
  let token: string | null
  try {
    token = storedToken(session)
  } catch (error) {
    return transport.requireSetup({ reason: "OTHER", message: asError(error).message, canContinue: false })
  }
  if (token === null) {
    return transport.requireSetup({ reason: "OTHER", message: "Switchboard is not set up for this session", canContinue: false })
  }
  let hub: WebSocket
  try {
    hub = await openHub(token)
  } catch (error) {
    const why = asError(error).message
    return transport.requireSetup({ reason: "AUTH_EXPIRED", message: `Switchboard refused the stored token: ${why}`, canContinue: false })
  }
  const bridge = new HubBridge({
    toHub: (message) => hub.send(JSON.stringify(message)),
    toClient: (message) => void transport.send(message).catch(() => undefined)
  }, `Switchboard /embed for ${session.origin}`)
  transport.onmessage = (message) => bridge.fromClient(message)
  transport.onclose = () => hub.close(1000)
  hub.onmessage = (event) => {
    const message = parse(event.data)
    if (isJsonRpcMessage(message)) bridge.fromHub(message)
  }
  // The transport stays open after the hub has gone: the spec has no message that says a frame
  // closed, so a closed frame would leave each later request of the client unanswered until its
  // timeout (60 s in the SDK), where the bridge answers it at once with why.
  hub.onclose = (event) => {
    bridge.hubClosed(event.reason.length > 0 ? `${event.reason} (${event.code})` : `the hub closed the connection (${event.code})`)
    // 1008 is the hub's word for a token it no longer takes: setup must run again before any
    // session can, and the outer frame ends this one on `canContinue: false`.
    if (event.code === 1008) {
      transport.requireSetup({ reason: "AUTH_EXPIRED", message: event.reason, canContinue: false }).catch((error: unknown) =>
        console.warn("switchboard /embed:", asError(error).message)
      )
    }
  }
  await transport.start()
}

void (isSetupPhase() ? runSetupPhase() : runTransportPhase()).catch((error: unknown) => console.error("switchboard /embed:", error))
