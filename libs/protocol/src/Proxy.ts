/**
 * The MCP Proxy Protocol (`shared/specs/mcp-proxy-protocol.md`): control-method params and results,
 * the router's KV records, and the messages its actors exchange. Real peers moved to snake_case
 * (`access_token`) a day after the spec was written; both spellings are accepted.
 */
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { Id, notification, Response as JsonRpcResponse } from "./JsonRpc.ts"

export const ReservedPrefixes = ["proxy:", "ext:"] as const

/** A token under either spelling: the spec's `accessToken`, or the `access_token` real peers moved to. */
const TokenFields = {
  accessToken: Schema.optional(Schema.String),
  access_token: Schema.optional(Schema.String)
}

/** What a peer that sent neither spelling is told. */
const TOKEN_REQUIRED = "accessToken is required"

/**
 * The extension's answer to the proxy's `authenticate` request (the `result` of its response):
 * a browser name and a token under either spelling, and an optional stable `client_id`. Decodes
 * to one `token`, so no handler has to look in two places.
 */
export const AuthenticateResult = Schema.transformOrFail(
  Schema.Struct({ name: Schema.String, ...TokenFields, client_id: Schema.optional(Schema.String) }),
  Schema.Struct({ name: Schema.String, token: Schema.String, clientId: Schema.optional(Schema.String) }),
  {
    strict: true,
    decode: (wire, _, ast) => {
      const token = wire.accessToken ?? wire.access_token
      if (token === undefined) return ParseResult.fail(new ParseResult.Type(ast, wire, TOKEN_REQUIRED))
      return ParseResult.succeed({ name: wire.name, token, ...(wire.client_id === undefined ? {} : { clientId: wire.client_id }) })
    },
    encode: (c) => ParseResult.succeed({ name: c.name, accessToken: c.token, ...(c.clientId === undefined ? {} : { client_id: c.clientId }) })
  }
)
export type AuthenticateResult = typeof AuthenticateResult.Type
/** The answer as the extension writes it on the wire. */
export type AuthenticateAnswer = typeof AuthenticateResult.Encoded

/** An MCP client's `mcp_handshake` params: a token under either spelling, decoded to one `token`. */
export const HandshakeParams = Schema.transformOrFail(
  Schema.Struct(TokenFields),
  Schema.Struct({ token: Schema.String }),
  {
    strict: true,
    decode: (wire, _, ast) => {
      const token = wire.accessToken ?? wire.access_token
      return token === undefined ? ParseResult.fail(new ParseResult.Type(ast, wire, TOKEN_REQUIRED)) : ParseResult.succeed({ token })
    },
    encode: (p) => ParseResult.succeed({ accessToken: p.token })
  }
)
export type HandshakeParams = typeof HandshakeParams.Type

export const ConnectParams = Schema.Struct({ extension_id: Schema.String })
export type ConnectParams = typeof ConnectParams.Type

/** The router's answer to a forwarded request while the client has no extension attached. */
export const NotConnected = "Not connected to an extension"

/** The `authenticated` notification's params: the proxy took the extension's token. */
export const AuthenticatedParams = Schema.Struct({ user_id: Schema.String, extension_id: Schema.String })
export type AuthenticatedParams = typeof AuthenticatedParams.Type

/** `mcp_handshake`'s result. */
export const HandshakeResult = Schema.Struct({
  authenticated: Schema.Literal(true),
  user_id: Schema.String,
  mcp_client_id: Schema.optional(Schema.String)
})
export type HandshakeResult = typeof HandshakeResult.Type

/** `list_extensions`' result: the user's connected extensions. */
export const ExtensionsResult = Schema.Struct({
  extensions: Schema.Array(Schema.Struct({ id: Schema.String, name: Schema.String, connected: Schema.optional(Schema.Boolean) }))
})
export type ExtensionsResult = typeof ExtensionsResult.Type

/** `connect`'s result: the proxy connection to the extension. */
export const ConnectResult = Schema.Struct({
  connection_id: Schema.String,
  extension_id: Schema.String,
  extension_name: Schema.optional(Schema.String)
})
export type ConnectResult = typeof ConnectResult.Type

/** The `disconnected` notification's params: the client's proxy connection ended. */
export const DisconnectedParams = Schema.Struct({ connection_id: Schema.String, reason: Schema.optional(Schema.String) })
export type DisconnectedParams = typeof DisconnectedParams.Type

/** The `status` notification the proxy sends each side on every change and as a keepalive. */
export const status = (connected: boolean, peerCount: number) =>
  notification("status", { connected, peer_count: peerCount, timestamp: new Date().toISOString() })

/** A connected extension, under its user in the `router_extensions` bucket. */
export const ExtensionRecord = Schema.Struct({
  id: Schema.String,
  name: Schema.String,
  user: Schema.String,
  conn: Schema.String,
  edge: Schema.String,
  clientId: Schema.optional(Schema.String),
  connectedAt: Schema.Number
})
export type ExtensionRecord = typeof ExtensionRecord.Type

/** One MCP client connected to one extension. */
export const ProxyConnectionRecord = Schema.Struct({
  connectionId: Schema.String,
  user: Schema.String,
  extensionId: Schema.String,
  extensionConn: Schema.String,
  extensionEdge: Schema.String,
  clientConn: Schema.String
})
export type ProxyConnectionRecord = typeof ProxyConnectionRecord.Type

/**
 * What a router actor must remember to be rebuilt on another replica (`router_sessions`, keyed by
 * the socket's connection id). Written on authentication, connect and disconnect only.
 */
export const SessionRecord = Schema.Union(
  Schema.Struct({ role: Schema.Literal("extension"), user: Schema.String, extensionId: Schema.String }),
  Schema.Struct({ role: Schema.Literal("client"), user: Schema.String, connectionId: Schema.optional(Schema.String) })
)
export type SessionRecord = typeof SessionRecord.Type

/** A page target as CDP's `Target.TargetInfo` describes it (`browser/Cdp.ts`'s `TargetInfo`). */
export const CdpTargetInfo = Schema.Struct({
  targetId: Schema.String,
  type: Schema.String,
  title: Schema.String,
  url: Schema.String,
  attached: Schema.Boolean,
  canAccessOpener: Schema.Boolean,
  browserContextId: Schema.optionalWith(Schema.String, { exact: true })
})

/** Where the answer to a CDP client's command goes: its own id, in its own session. */
const CdpReplyTo = { id: Schema.Number, sessionId: Schema.optionalWith(Schema.String, { exact: true }) }

/**
 * What a CDP client's actor awaits of the extension, by the request's mapped id: data, not a
 * callback, so that a replica that stops can hand it to the one that adopts the socket.
 */
export const CdpAwaited = Schema.Union(
  /** A command in a page's session: its answer goes to the client as it is. */
  Schema.TaggedStruct("Command", CdpReplyTo),
  /** `Target.createTarget`'s new tab; the debugger attaches to it next. */
  Schema.TaggedStruct("CreateTab", CdpReplyTo),
  /** `Target.createTarget`'s tab, being attached; it becomes a page of the client. */
  Schema.TaggedStruct("AttachTab", { ...CdpReplyTo, tabId: Schema.Number }),
  Schema.TaggedStruct("ActivateTab", CdpReplyTo),
  Schema.TaggedStruct("CloseTab", CdpReplyTo),
  /** A tab let go, or one closed again: nobody awaits the answer. */
  Schema.TaggedStruct("Unanswered", {})
)
export type CdpAwaited = typeof CdpAwaited.Type

/**
 * What a router actor keeps only in memory, handed to the replica that adopts its socket when its
 * own stops: a client's requests in flight (mapped id → its own id), an extension's internal
 * requests (`proxy:` id → where the answer goes), and a CDP client's whole emulated browser (its
 * attachment to the extension, its pages and their sessions, and its commands in flight). Their
 * answers then reach the adopter.
 */
export const HandoffState = Schema.Union(
  Schema.Struct({
    role: Schema.Literal("client"),
    pending: Schema.Array(Schema.Struct({ mapped: Schema.String, id: Id, method: Schema.String }))
  }),
  Schema.Struct({
    role: Schema.Literal("extension"),
    internal: Schema.Array(Schema.Struct({ id: Schema.String, reply: Schema.String }))
  }),
  Schema.Struct({
    role: Schema.Literal("cdp"),
    /** The proxy connection: the extension keys the tabs this client drives by it. */
    connectionId: Schema.String,
    extensionId: Schema.String,
    extensionConn: Schema.String,
    extensionEdge: Schema.String,
    pages: Schema.Array(Schema.Struct({ tabId: Schema.Number, sessionId: Schema.String, info: CdpTargetInfo })),
    /** Child targets' sessions (iframes, workers), with the tab each is in. */
    children: Schema.Array(Schema.Struct({ sessionId: Schema.String, tabId: Schema.Number })),
    autoAttach: Schema.Boolean,
    discover: Schema.Boolean,
    /** The last mapped id sent, so that the adopter mints none twice. */
    sequence: Schema.Number,
    pending: Schema.Array(Schema.Struct({ mapped: Schema.String, awaited: CdpAwaited }))
  })
)
export type HandoffState = typeof HandoffState.Type

// --- the router's peer protocol: what its actors, and other services, say to its actors ------

/** Why an extension's actor refused to attach a client (the extension is gone, or another user's). */
export class AttachRefused extends Schema.TaggedError<AttachRefused>()("AttachRefused", { reason: Schema.String }) {}

/** Client actor → extension actor: attach a new proxy connection; the extension's name and peer count come back. */
export class Attach extends Schema.TaggedRequest<Attach>()("Attach", {
  failure: AttachRefused,
  success: Schema.Struct({ name: Schema.String, peerCount: Schema.Number }),
  payload: { connectionId: Schema.String, user: Schema.String, clientConn: Schema.String }
}) {}

/**
 * Client actor ⇄ extension actor: is proxy connection `connectionId` still attached to you? Asked
 * when an `ExtensionGone` or a `Detach` may have been lost (core NATS keeps nothing for a replica
 * whose connection dropped), and by a client whose forwarded request timed out. `attached: false`,
 * or nobody listening on the peer's connection, means the peer is gone for this connection.
 */
export class Probe extends Schema.TaggedRequest<Probe>()("Probe", {
  failure: Schema.Never,
  success: Schema.Struct({ attached: Schema.Boolean }),
  payload: { connectionId: Schema.String }
}) {}

/** Client actor → extension actor: the proxy connection ended. */
export class Detach extends Schema.TaggedClass<Detach>()("Detach", { connectionId: Schema.String }) {}

/**
 * Extension actor → client actor: the extension's JSON-RPC response to a forwarded request, still
 * under its mapped id. Parsed once, by the extension's actor. One per forwarded request, so a plain
 * tagged struct: a class instance costs microseconds to construct, an object literal nothing.
 */
export const Answer = Schema.TaggedStruct("Answer", { response: JsonRpcResponse })
export type Answer = typeof Answer.Type

/** Extension actor → client actors: the extension went away. */
export class ExtensionGone extends Schema.TaggedClass<ExtensionGone>()("ExtensionGone", {
  connectionId: Schema.String,
  reason: Schema.String
}) {}

/** Extension actor → client actors: how many clients the extension has now. */
export class PeerStatus extends Schema.TaggedClass<PeerStatus>()("PeerStatus", {
  connectionId: Schema.String,
  peerCount: Schema.Number
}) {}

/** Why an internal request got no result: the extension's JSON-RPC error, or why nobody could answer. */
export class InternalFailure extends Schema.TaggedError<InternalFailure>()("InternalFailure", {
  code: Schema.Int,
  message: Schema.String
}) {}

/**
 * Another service → the router (`router.internal`), and the router → the extension's actor: run
 * one proxy-protocol method on the user's most recently connected extension, as the proxy itself;
 * its `result` comes back.
 */
export class InternalRequest extends Schema.TaggedRequest<InternalRequest>()("InternalRequest", {
  failure: InternalFailure,
  success: Schema.Unknown,
  payload: {
    user: Schema.String,
    method: Schema.String,
    params: Schema.optional(Schema.Record({ key: Schema.String, value: Schema.Unknown }))
  }
}) {}

/**
 * Extension actor → the CDP client actor driving the tab: one CDP event from the extension's
 * `forwardCDPEvent` (`browser/Cdp.ts`). Many per page load, so a plain tagged struct.
 */
export const CdpEvent = Schema.TaggedStruct("CdpEvent", {
  tabId: Schema.Number,
  sessionId: Schema.optional(Schema.String),
  method: Schema.String,
  params: Schema.optional(Schema.Record({ key: Schema.String, value: Schema.Unknown }))
})
export type CdpEvent = typeof CdpEvent.Type

/** Every message between the router's actors, and from other services to them. */
export const RouterPeer = Schema.Union(Attach, Probe, Detach, Answer, CdpEvent, ExtensionGone, PeerStatus, InternalRequest)
export type RouterPeer = typeof RouterPeer.Type
