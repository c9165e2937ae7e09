/**
 * The transports without a browser: fake windows that deliver `postMessage` as a browser does
 * (later, only when the target origin matches, with the sender's origin and window as `origin`
 * and `source`), and the MCP SDK's real `Client` and `McpServer` on either side. Fast to run;
 * test/src/postmessage.test.ts proves the same in Chromium.
 */
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js"
import { describe, expect, it } from "@effect/vitest"
import * as Option from "effect/Option"
import * as z from "zod"
import type { FrameControl } from "../src/FrameControl.ts"
import { InnerFrameSetup } from "../src/InnerFrameSetup.ts"
import { InnerFrameTransport } from "../src/InnerFrameTransport.ts"
import * as Messages from "../src/Messages.ts"
import { runSetup } from "../src/OuterFrameSetup.ts"
import { OuterFrameTransport } from "../src/OuterFrameTransport.ts"
import type { Arrival, MessageHost, PeerWindow } from "../src/Peer.ts"

type Listener = (event: Arrival) => void
interface Sent {
  readonly from: string
  readonly targetOrigin: string
  readonly data: unknown
}

class FakeWindow implements MessageHost {
  private readonly listeners = new Set<Listener>()
  constructor(readonly origin: string) {}
  addEventListener(_type: "message", listener: Listener) {
    this.listeners.add(listener)
  }
  removeEventListener(_type: "message", listener: Listener) {
    this.listeners.delete(listener)
  }
  dispatch(event: Arrival) {
    this.listeners.forEach((listener) => listener(event))
  }
}

/** The reference `from` holds to `to`: what arrives through it has `source()` as its source. */
const reference = (log: Array<Sent>, from: FakeWindow, to: FakeWindow, source: () => PeerWindow): PeerWindow => ({
  postMessage(data, targetOrigin) {
    log.push({ from: from.origin, targetOrigin, data })
    if (targetOrigin !== "*" && targetOrigin !== to.origin) return // the browser drops it
    const event = { data: structuredClone(data), origin: from.origin, source: source() }
    setTimeout(() => to.dispatch(event))
  }
})

const APP = "https://app.example"
const TOOLS = "https://tools.example"

/** An outer window (APP) and the inner window (TOOLS) it frames, each with its reference to the other. */
const pair = () => {
  const log: Array<Sent> = []
  const outer = new FakeWindow(APP)
  const inner = new FakeWindow(TOOLS)
  const toInner: PeerWindow = reference(log, outer, inner, () => toOuter)
  const toOuter: PeerWindow = reference(log, inner, outer, () => toInner)
  return { log, outer, inner, toInner, toOuter }
}

/** A frame whose navigation starts the inner side the test provides. */
const fakeFrame = (window: PeerWindow, onNavigate: (url: string) => void) => {
  const urls: Array<string> = []
  const visible: Array<boolean> = []
  const frame: FrameControl = {
    window,
    navigate: (url) => {
      urls.push(url)
      onNavigate(url)
    },
    setVisible: (v) => visible.push(v),
    close: () => undefined
  }
  return { frame, urls, visible }
}

const adder = () => {
  const server = new McpServer({ name: "adder", version: "1.0.0" })
  server.registerTool("add", { inputSchema: { a: z.number(), b: z.number() } }, ({ a, b }) => ({ content: [{ type: "text", text: String(a + b) }] }))
  return server
}

describe("postMessage transports over fake windows", () => {
  it("an SDK Client calls an SDK McpServer; only the inner frame's first message goes to '*'", async () => {
    const { inner, log, outer, toInner, toOuter } = pair()
    const server = adder()
    const { frame, urls } = fakeFrame(toInner, () => void server.connect(new InnerFrameTransport({ allowedOrigins: [APP], host: inner, outer: toOuter })))
    const client = new Client({ name: "app", version: "1.0.0" })
    const transport = new OuterFrameTransport(frame, { serverUrl: `${TOOLS}/mcp#stale`, sessionId: "s1", host: outer })
    await client.connect(transport)
    // The SDK initialized: the postMessage session id is not passed off as an MCP session to resume.
    expect(server.server.getClientVersion()).toEqual({ name: "app", version: "1.0.0" })
    expect(transport.session).toEqual({ sessionId: "s1", origin: TOOLS })

    expect((await client.callTool({ name: "add", arguments: { a: 2, b: 3 } })).content).toEqual([{ type: "text", text: "5" }])
    expect(urls).toEqual([`${TOOLS}/mcp`])
    expect(log[0]).toEqual({ from: TOOLS, targetOrigin: "*", data: { type: "MCP_TRANSPORT_HANDSHAKE", protocolVersion: "1.0" } })
    expect(log.slice(1).map(({ from, targetOrigin }) => [from, targetOrigin])).toEqual(
      log.slice(1).map(({ from }) => [from, from === APP ? TOOLS : APP])
    )
    await client.close()
  })

  it("setup: the inner frame learns the session id and the asking origin, and completes with a title", async () => {
    const { inner, log, outer, toInner, toOuter } = pair()
    const { frame, urls, visible } = fakeFrame(toInner, () => {
      const setup = new InnerFrameSetup({ allowedOrigins: [APP], requiresVisibleSetup: true, host: inner, outer: toOuter })
      void setup.handshake().then(({ origin, sessionId }) =>
        setup.complete({ serverTitle: `for ${origin} ${sessionId}`, transportVisibility: { requirement: "optional", optionalMessage: "logs" } })
      )
    })
    const result = await runSetup(frame, { serverUrl: `${TOOLS}/mcp`, sessionId: "s2", host: outer })
    expect(result).toEqual({
      type: "MCP_SETUP_COMPLETE",
      status: "success",
      serverTitle: `for ${APP} s2`,
      // The reference implementation's outer frame reads the title as displayName.
      displayName: `for ${APP} s2`,
      transportVisibility: { requirement: "optional", optionalMessage: "logs" }
    })
    expect(urls).toEqual([`${TOOLS}/mcp#setup`])
    expect(visible).toEqual([false, true])
    // The spec's version and the reference's later range, side by side.
    expect(log[0]?.data).toEqual({ type: "MCP_SETUP_HANDSHAKE", protocolVersion: "1.0", minProtocolVersion: "1.0", maxProtocolVersion: "1.0", requiresVisibleSetup: true })
  })

  it("another window of an allowed origin is not heard: its handshake reply does not pin the inner frame", async () => {
    const { inner, log, outer, toInner, toOuter } = pair()
    const impostor = new FakeWindow(APP)
    const impostorToInner = reference(log, impostor, inner, () => ({ postMessage: () => undefined }))
    let transport: InnerFrameTransport | undefined
    const { frame } = fakeFrame(toInner, () => {
      transport = new InnerFrameTransport({ allowedOrigins: [APP], host: inner, outer: toOuter })
      void adder().connect(transport)
      // Queued before the real reply can be.
      impostorToInner.postMessage({ type: "MCP_TRANSPORT_HANDSHAKE_REPLY", protocolVersion: "1.0", sessionId: "impostor" }, "*")
    })
    const client = new Client({ name: "app", version: "1.0.0" })
    await client.connect(new OuterFrameTransport(frame, { serverUrl: `${TOOLS}/mcp`, sessionId: "s3", host: outer }))
    expect(transport?.session).toEqual({ sessionId: "s3", origin: APP })
    await client.close()
  })

  it("the inner frame repeats its handshake until answered: an outer frame that starts listening after the first one (after load) still connects", async () => {
    const { inner, log, outer, toInner, toOuter } = pair()
    const server = adder()
    const innerErrors: Array<string> = []
    const transport = new InnerFrameTransport({ allowedOrigins: [APP], host: inner, outer: toOuter, announceEveryMs: 1 })
    transport.onerror = (e) => innerErrors.push(e.message)
    void server.connect(transport)
    // The first announcement is delivered (a task later) while nobody on the outer side listens.
    expect(log.map((m) => m.data)).toEqual([{ type: "MCP_TRANSPORT_HANDSHAKE", protocolVersion: "1.0" }])
    await new Promise<void>((resolve) => setTimeout(resolve))
    const { frame } = fakeFrame(toInner, () => undefined) // the page is already loaded
    const client = new Client({ name: "app", version: "1.0.0" })
    const outerTransport = new OuterFrameTransport(frame, { serverUrl: `${TOOLS}/mcp`, sessionId: "s5", host: outer, handshakeTimeoutMs: 2000 })
    const outerErrors: Array<string> = []
    outerTransport.onerror = (e) => outerErrors.push(e.message)
    await client.connect(outerTransport)
    expect((await client.callTool({ name: "add", arguments: { a: 1, b: 1 } })).content).toEqual([{ type: "text", text: "2" }])
    expect(log.filter((m) => m.targetOrigin === "*").length).toBeGreaterThan(1)
    // Repeats that crossed the answer are neither a second handshake nor a second reply.
    expect([innerErrors, outerErrors]).toEqual([[], []])
    const announced = log.filter((m) => m.targetOrigin === "*").length
    await client.callTool({ name: "add", arguments: { a: 1, b: 2 } })
    expect(log.filter((m) => m.targetOrigin === "*").length).toBe(announced) // answered: no more
    await client.close()
  })

  it("setup: a handshake offering a version range (the reference's later form) is answered with the newest common version; no common one is a clear error", async () => {
    const answered = async (range: { minProtocolVersion: string; maxProtocolVersion: string }) => {
      const { inner, log, outer, toInner, toOuter } = pair()
      const { frame } = fakeFrame(toInner, () => {
        toOuter.postMessage({ type: "MCP_SETUP_HANDSHAKE", ...range, requiresVisibleSetup: false }, "*")
        inner.addEventListener("message", () =>
          toOuter.postMessage({ type: "MCP_SETUP_COMPLETE", status: "success", displayName: "Ranged", transportVisibility: { requirement: "hidden" } }, APP))
      })
      const result = await runSetup(frame, { serverUrl: `${TOOLS}/mcp`, sessionId: "s6", host: outer, handshakeTimeoutMs: 1000 })
      return { result, reply: log.find((m) => m.from === APP)?.data }
    }
    expect(await answered({ minProtocolVersion: "0.9", maxProtocolVersion: "2.0" })).toEqual({
      result: { type: "MCP_SETUP_COMPLETE", status: "success", serverTitle: "Ranged", transportVisibility: { requirement: "hidden" } },
      reply: { type: "MCP_SETUP_HANDSHAKE_REPLY", protocolVersion: "1.0", sessionId: "s6" }
    })
    await expect(answered({ minProtocolVersion: "1.10", maxProtocolVersion: "3.0" })).rejects.toMatchObject({
      reason: "UnsupportedVersion",
      message: "the peer speaks postMessage transport 1.10 to 3.0; this side speaks 1.0"
    })
  })

  it("MCP_SETUP_REQUIRED with canContinue false during the session ends it: a request in flight fails at once, the SDK sees the close", async () => {
    const { inner, outer, toInner, toOuter } = pair()
    const server = new McpServer({ name: "stuck", version: "1.0.0" })
    let called: () => void = () => undefined
    const arrived = new Promise<void>((resolve) => (called = resolve))
    server.registerTool("wait", { inputSchema: {} }, () => {
      called()
      return new Promise(() => undefined) // never answered: the frame lost what it needed to answer
    })
    const innerTransport = new InnerFrameTransport({ allowedOrigins: [APP], host: inner, outer: toOuter })
    const { frame } = fakeFrame(toInner, () => void server.connect(innerTransport))
    const transport = new OuterFrameTransport(frame, { serverUrl: `${TOOLS}/mcp`, sessionId: "s5", host: outer })
    const required: Array<Messages.SetupRequired> = []
    const errors: Array<unknown> = []
    transport.onsetuprequired = (m) => required.push(m)
    transport.onerror = (e) => errors.push(e)
    const client = new Client({ name: "app", version: "1.0.0" })
    let clientClosed = false
    client.onclose = () => (clientClosed = true)
    await client.connect(transport)

    const call = client.callTool({ name: "wait", arguments: {} })
    await arrived
    await innerTransport.requireSetup({ reason: "AUTH_EXPIRED", message: "the token expired", canContinue: false })
    await expect(call).rejects.toThrow("Connection closed")
    expect(clientClosed).toBe(true)
    expect(required).toEqual([{ type: "MCP_SETUP_REQUIRED", reason: "AUTH_EXPIRED", message: "the token expired", canContinue: false }])
    expect(errors).toMatchObject([{ reason: "SetupRequired", message: "setup required (AUTH_EXPIRED): the token expired" }])
    await expect(client.listTools()).rejects.toThrow("Not connected")
  })

  it("a handshake of another protocol version fails connect with UnsupportedVersion", async () => {
    const { outer, toInner, toOuter } = pair()
    const { frame } = fakeFrame(toInner, () => toOuter.postMessage({ type: "MCP_TRANSPORT_HANDSHAKE", protocolVersion: "2.0" }, "*"))
    const client = new Client({ name: "app", version: "1.0.0" })
    await expect(client.connect(new OuterFrameTransport(frame, { serverUrl: `${TOOLS}/mcp`, sessionId: "s4", host: outer }))).rejects.toMatchObject({
      reason: "UnsupportedVersion",
      message: "the peer speaks postMessage transport 2.0; this side speaks 1.0"
    })
  })
})

describe("postMessage messages", () => {
  it("decodes every message of the spec, takes displayName for serverTitle, and rejects the malformed", () => {
    const complete = { type: "MCP_SETUP_COMPLETE", status: "success", displayName: "Pi", transportVisibility: { requirement: "hidden" } }
    expect(Messages.decode(complete)).toEqual(Option.some({ type: "MCP_SETUP_COMPLETE", status: "success", serverTitle: "Pi", transportVisibility: { requirement: "hidden" } }))
    const required = { type: "MCP_SETUP_REQUIRED", reason: "AUTH_EXPIRED", message: "m", canContinue: false }
    expect([Messages.isSetupMessage(required), Messages.isTransportMessage(required)]).toEqual([false, true])
    expect(Messages.isSetupMessage({ type: "MCP_SETUP_HANDSHAKE", protocolVersion: "1.0", requiresVisibleSetup: false })).toBe(true)
    expect(Messages.isTransportMessage({ type: "MCP_TRANSPORT_ACCEPTED", sessionId: "s" })).toBe(true)
    expect(Messages.isMCPMessage({ type: "MCP_MESSAGE", payload: { jsonrpc: "2.0", id: 1, method: "tools/list", _meta: {} } })).toBe(true)
    expect(Messages.isMCPMessage({ type: "MCP_MESSAGE", payload: { jsonrpc: "1.0", id: 1, method: "tools/list" } })).toBe(false)
    expect(Messages.isMCPMessage({ type: "MCP_MESSAGE", payload: { jsonrpc: "2.0", id: {}, method: "tools/list" } })).toBe(false)
    expect(Messages.isPostMessageProtocol({ type: "MCP_TRANSPORT_HANDSHAKE_REPLY", protocolVersion: "1.0" })).toBe(false) // no sessionId
    expect(Messages.isPostMessageProtocol({ type: "MCP_SOMETHING_ELSE" })).toBe(false)
  })
})
