/**
 * Every message of the postMessage transport spec, as Schemas: one decode point for what arrives
 * on `message` events, and the type guards the spec names. Anything that does not decode is not a
 * protocol message and is ignored by the transports.
 */
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"

/** The only transport protocol version this library speaks. */
export const PROTOCOL_VERSION = "1.0"

// The version is a plain string on the wire so that a peer speaking another version is told so,
// instead of having its handshake silently ignored.
const Version = Schema.String

// The spec's setup handshake names one version; a later revision of the reference implementation
// (jmandel/mcp-postmessage) names a range instead, and its outer frame reads only the range. We
// send both forms and accept either: a handshake must carry one of them.
export const SetupHandshake = Schema.Struct({
  type: Schema.Literal("MCP_SETUP_HANDSHAKE"),
  protocolVersion: Schema.optional(Version),
  minProtocolVersion: Schema.optional(Version),
  maxProtocolVersion: Schema.optional(Version),
  requiresVisibleSetup: Schema.Boolean
}).pipe(Schema.filter((h) => h.protocolVersion !== undefined || (h.minProtocolVersion !== undefined && h.maxProtocolVersion !== undefined)))
export type SetupHandshake = typeof SetupHandshake.Type

export const SetupHandshakeReply = Schema.Struct({
  type: Schema.Literal("MCP_SETUP_HANDSHAKE_REPLY"),
  protocolVersion: Version,
  sessionId: Schema.String
})
export type SetupHandshakeReply = typeof SetupHandshakeReply.Type

export const Visibility = Schema.Literal("required", "optional", "hidden")
export type Visibility = typeof Visibility.Type

export const TransportVisibility = Schema.Struct({
  requirement: Visibility,
  optionalMessage: Schema.optional(Schema.String)
})
export type TransportVisibility = typeof TransportVisibility.Type

export const SetupErrorCode = Schema.Literal("USER_CANCELLED", "AUTH_FAILED", "TIMEOUT", "CONFIG_ERROR")
export type SetupErrorCode = typeof SetupErrorCode.Type

const SetupCompleteFields = {
  type: Schema.Literal("MCP_SETUP_COMPLETE"),
  status: Schema.Literal("success", "error"),
  ephemeralMessage: Schema.optional(Schema.String),
  transportVisibility: TransportVisibility,
  error: Schema.optional(Schema.Struct({ code: SetupErrorCode, message: Schema.String }))
}

// The reference implementation's outer frame (jmandel/mcp-postmessage, every revision) reads the
// title as `displayName` where the spec says `serverTitle`; we send both, and accept either.
export const SetupComplete = Schema.Struct({ ...SetupCompleteFields, serverTitle: Schema.String, displayName: Schema.optional(Schema.String) })
export type SetupComplete = typeof SetupComplete.Type

const SetupCompleteWithDisplayName = Schema.transform(
  Schema.Struct({ ...SetupCompleteFields, displayName: Schema.String }),
  Schema.typeSchema(SetupComplete),
  {
    strict: true,
    decode: ({ displayName, ...rest }) => ({ ...rest, serverTitle: displayName }),
    encode: ({ serverTitle, ...rest }) => ({ ...rest, displayName: serverTitle })
  }
)

export const TransportHandshake = Schema.Struct({
  type: Schema.Literal("MCP_TRANSPORT_HANDSHAKE"),
  protocolVersion: Version
})
export type TransportHandshake = typeof TransportHandshake.Type

export const TransportHandshakeReply = Schema.Struct({
  type: Schema.Literal("MCP_TRANSPORT_HANDSHAKE_REPLY"),
  sessionId: Schema.String,
  protocolVersion: Version
})
export type TransportHandshakeReply = typeof TransportHandshakeReply.Type

export const TransportAccepted = Schema.Struct({
  type: Schema.Literal("MCP_TRANSPORT_ACCEPTED"),
  sessionId: Schema.String
})
export type TransportAccepted = typeof TransportAccepted.Type

export const SetupRequiredReason = Schema.Literal("AUTH_EXPIRED", "CONFIG_CHANGED", "PERMISSIONS_CHANGED", "OTHER")

export const SetupRequired = Schema.Struct({
  type: Schema.Literal("MCP_SETUP_REQUIRED"),
  reason: SetupRequiredReason,
  message: Schema.String,
  canContinue: Schema.Boolean
})
export type SetupRequired = typeof SetupRequired.Type

// The JSON-RPC 2.0 shapes MCP uses. Checked with `Schema.is`, so the payload is handed to the SDK
// exactly as it arrived (extra members such as `_meta` kept).
const Id = Schema.Union(Schema.String, Schema.Number)
const Params = Schema.optional(Schema.Record({ key: Schema.String, value: Schema.Unknown }))
export const JsonRpcMessage = Schema.Union(
  Schema.Struct({ jsonrpc: Schema.Literal("2.0"), id: Id, method: Schema.String, params: Params }),
  // A notification has no id at all: a request with a malformed id is not one.
  Schema.Struct({ jsonrpc: Schema.Literal("2.0"), id: Schema.optionalWith(Schema.Never, { exact: true }), method: Schema.String, params: Params }),
  Schema.Struct({ jsonrpc: Schema.Literal("2.0"), id: Id, result: Schema.Record({ key: Schema.String, value: Schema.Unknown }) }),
  Schema.Struct({
    jsonrpc: Schema.Literal("2.0"),
    id: Schema.optional(Id),
    error: Schema.Struct({ code: Schema.Number, message: Schema.String, data: Schema.optional(Schema.Unknown) })
  })
)
const isJsonRpcMessage = Schema.is(JsonRpcMessage)

export const McpMessage = Schema.Struct({
  type: Schema.Literal("MCP_MESSAGE"),
  payload: Schema.declare(isJsonRpcMessage)
})
export type McpMessage = typeof McpMessage.Type

export type SetupMessage = SetupHandshake | SetupHandshakeReply | SetupComplete
export type TransportMessage = TransportHandshake | TransportHandshakeReply | TransportAccepted | SetupRequired | McpMessage
export type ProtocolMessage = SetupMessage | TransportMessage

export const ProtocolMessage = Schema.Union(
  SetupHandshake,
  SetupHandshakeReply,
  SetupComplete,
  SetupCompleteWithDisplayName,
  TransportHandshake,
  TransportHandshakeReply,
  TransportAccepted,
  SetupRequired,
  McpMessage
)

const decodeOption = Schema.decodeUnknownOption(ProtocolMessage)

/** The protocol message in `data`, if it is one; anything else is none. */
export const decode = (data: unknown): Option.Option<ProtocolMessage> => decodeOption(data)

const typeOf = (data: unknown): string | undefined =>
  typeof data === "object" && data !== null && "type" in data && typeof data.type === "string" ? data.type : undefined

/** A well-formed message of this protocol (the spec's guard, plus a structural check). */
export const isPostMessageProtocol = (data: unknown): data is ProtocolMessage => Option.isSome(decode(data))

/** A well-formed setup-phase message: `MCP_SETUP_*` except `MCP_SETUP_REQUIRED`, which is a runtime one. */
export const isSetupMessage = (data: unknown): data is SetupMessage => {
  const type = typeOf(data)
  return type !== undefined && type.startsWith("MCP_SETUP_") && type !== "MCP_SETUP_REQUIRED" && isPostMessageProtocol(data)
}

/** A well-formed transport-phase message. */
export const isTransportMessage = (data: unknown): data is TransportMessage => {
  const type = typeOf(data)
  return type !== undefined &&
    (type.startsWith("MCP_TRANSPORT_") || type === "MCP_SETUP_REQUIRED" || type === "MCP_MESSAGE") &&
    isPostMessageProtocol(data)
}

/** A well-formed `MCP_MESSAGE` whose payload is a JSON-RPC 2.0 message. */
export const isMCPMessage = (data: unknown): data is McpMessage => typeOf(data) === "MCP_MESSAGE" && isPostMessageProtocol(data)
