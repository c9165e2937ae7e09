/**
 * The MCP Proxy Protocol (`shared/specs/mcp-proxy-protocol.md`): control-method params and results,
 * the router's KV records, and the messages its actors exchange. Real peers moved to snake_case
 * (`access_token`) a day after the spec was written; both spellings are accepted.
 */
import * as Schema from "effect/Schema"
import { Id } from "./JsonRpc.ts"

export const ReservedPrefixes = ["proxy:", "ext:"] as const

/** The extension's answer to the proxy's `authenticate` request. */
export const AuthenticateResult = Schema.Struct({
  name: Schema.String,
  accessToken: Schema.optional(Schema.String),
  access_token: Schema.optional(Schema.String),
  client_id: Schema.optional(Schema.String)
})
export type AuthenticateResult = typeof AuthenticateResult.Type

export const HandshakeParams = Schema.Struct({
  accessToken: Schema.optional(Schema.String),
  access_token: Schema.optional(Schema.String)
})
export type HandshakeParams = typeof HandshakeParams.Type

export const ConnectParams = Schema.Struct({ extension_id: Schema.String })
export type ConnectParams = typeof ConnectParams.Type

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

/**
 * What a router actor keeps only in memory, handed to the replica that adopts its socket when its
 * own stops: a client's requests in flight (mapped id → its own id), an extension's internal
 * requests (`proxy:` id → where the answer goes). Their answers then reach the adopter.
 */
export const HandoffState = Schema.Union(
  Schema.Struct({
    role: Schema.Literal("client"),
    pending: Schema.Array(Schema.Struct({ mapped: Schema.String, id: Id, method: Schema.String }))
  }),
  Schema.Struct({
    role: Schema.Literal("extension"),
    internal: Schema.Array(Schema.Struct({ id: Schema.String, reply: Schema.String }))
  })
)
export type HandoffState = typeof HandoffState.Type

/** Client actor → extension actor (a request): attach a new proxy connection. */
export const Attach = Schema.Struct({
  connectionId: Schema.String,
  user: Schema.String,
  clientConn: Schema.String
})
export type Attach = typeof Attach.Type

export const AttachReply = Schema.Union(
  Schema.Struct({ ok: Schema.Literal(true), name: Schema.String, peerCount: Schema.Number }),
  Schema.Struct({ ok: Schema.Literal(false), reason: Schema.String })
)
export type AttachReply = typeof AttachReply.Type

/** Client actor → extension actor: the proxy connection ended. */
export const Detach = Schema.Struct({ connectionId: Schema.String })
export type Detach = typeof Detach.Type

/** Extension actor → client actors: the extension went away, or its peer count changed. */
export const ExtensionGone = Schema.Struct({ connectionId: Schema.String, reason: Schema.String })
export type ExtensionGone = typeof ExtensionGone.Type
export const PeerStatus = Schema.Struct({ connectionId: Schema.String, peerCount: Schema.Number })
export type PeerStatus = typeof PeerStatus.Type

/**
 * Another service → the router (`router.internal`), and the router → the extension's actor: run
 * one proxy-protocol method on the user's most recently connected extension, as the proxy itself.
 */
export const InternalRequest = Schema.Struct({
  user: Schema.String,
  method: Schema.String,
  params: Schema.optional(Schema.Record({ key: Schema.String, value: Schema.Unknown }))
})
export type InternalRequest = typeof InternalRequest.Type

/** The extension's answer to an internal request, or why there is none (JSON-RPC error codes). */
export const InternalReply = Schema.Union(
  Schema.Struct({ ok: Schema.Literal(true), result: Schema.Unknown }),
  Schema.Struct({ ok: Schema.Literal(false), code: Schema.Int, message: Schema.String })
)
export type InternalReply = typeof InternalReply.Type

/** The `kind` header of peer messages between router actors. */
export const PeerKind = {
  reply: "reply",
  attach: "attach",
  detach: "detach",
  gone: "gone",
  status: "status",
  /** The router's internal client → an extension's actor (a request, answered with `InternalReply`). */
  internal: "internal"
} as const
