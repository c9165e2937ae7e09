/**
 * The postMessage transport for MCP (docs/protocols/postmessage.md): an outer frame and an
 * inner frame (iframe or popup) run the setup phase once and the transport phase on every
 * connection, with origins pinned from `event.origin` and allow-lists on both sides.
 */
export * from "./FrameControl.ts"
export * from "./InnerFrameSetup.ts"
export * from "./InnerFrameTransport.ts"
export * as Messages from "./Messages.ts"
export { isMCPMessage, isPostMessageProtocol, isSetupMessage, isTransportMessage, PROTOCOL_VERSION } from "./Messages.ts"
export * from "./OuterFrameSetup.ts"
export * from "./OuterFrameTransport.ts"
export { isSetupPhase } from "./internal/Phases.ts"
export type { Arrival, MessageHost, PeerWindow, Session } from "./Peer.ts"
export * from "./PostMessageError.ts"
