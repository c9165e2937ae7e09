/**
 * JSON-RPC 2.0 messages as Schemas, and the one place that turns a raw text frame into either a
 * typed message or the exact error response the spec says to send back.
 */
import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { errorResponse, ErrorCode, isId, isRecord } from "./browser/JsonRpc.ts"
import * as Json from "./Json.ts"

// The plain parts (codes, guards, the builders every sender uses) are shared with the browser
// bundles, so they live where effect is not imported.
export { ErrorCode, errorResponse, failure, isRecord, notification, request, result } from "./browser/JsonRpc.ts"

export const Id = Schema.Union(Schema.String, Schema.Number)
export type Id = typeof Id.Type

const Version = Schema.Literal("2.0")
/**
 * Params are by-name or by-position. Several real peers of these protocols omit `jsonrpc`, so it is
 * optional on input (a wrong value is still invalid) and always written on output.
 */
const Params = Schema.Union(Schema.Record({ key: Schema.String, value: Schema.Unknown }), Schema.Array(Schema.Unknown))

export const Request = Schema.Struct({
  jsonrpc: Schema.optional(Version),
  id: Id,
  method: Schema.String,
  params: Schema.optional(Params)
})
export type Request = typeof Request.Type

export const Notification = Schema.Struct({
  jsonrpc: Schema.optional(Version),
  method: Schema.String,
  params: Schema.optional(Params)
})
export type Notification = typeof Notification.Type

export const ErrorObject = Schema.Struct({
  code: Schema.Int,
  message: Schema.String,
  data: Schema.optional(Schema.Unknown)
})
export type ErrorObject = typeof ErrorObject.Type

export const SuccessResponse = Schema.Struct({
  jsonrpc: Schema.optional(Version),
  id: Id,
  result: Schema.Unknown
})
export type SuccessResponse = typeof SuccessResponse.Type

export const ErrorResponse = Schema.Struct({
  jsonrpc: Schema.optional(Version),
  id: Schema.NullOr(Id),
  error: ErrorObject
})
export type ErrorResponse = typeof ErrorResponse.Type

export const Response = Schema.Union(SuccessResponse, ErrorResponse)
export type Response = typeof Response.Type
export type Message = Request | Notification | Response

/** A decoded frame, tagged by what it is so handlers can switch on `_tag`. */
export type Incoming =
  | { readonly _tag: "Request"; readonly message: Request }
  | { readonly _tag: "Notification"; readonly message: Notification }
  | { readonly _tag: "Response"; readonly message: Response }

const decodeRequest = Schema.decodeUnknownEither(Request, { onExcessProperty: "preserve" })
const decodeNotification = Schema.decodeUnknownEither(Notification, { onExcessProperty: "preserve" })
const decodeSuccess = Schema.decodeUnknownEither(SuccessResponse, { onExcessProperty: "preserve" })
const decodeError = Schema.decodeUnknownEither(ErrorResponse, { onExcessProperty: "preserve" })

const invalid = (raw: unknown, issue: ParseResult.ParseError | string): ErrorResponse =>
  errorResponse(
    isRecord(raw) && isId(raw["id"]) ? raw["id"] : null,
    ErrorCode.InvalidRequest,
    `Invalid Request: ${typeof issue === "string" ? issue : ParseResult.TreeFormatter.formatErrorSync(issue)}`
  )

/**
 * The Schema-only classification: the reference the fast path in `decodeValue` must agree with, and
 * what builds the -32600 text when it doesn't accept a value. Exported for tests; use `decodeValue`.
 */
export const decodeValueWithSchema = (raw: unknown): Either.Either<Incoming, ErrorResponse> => {
  if (!isRecord(raw)) return Either.left(invalid(raw, "expected a JSON object"))
  if ("method" in raw) {
    if ("id" in raw && raw["id"] !== undefined) {
      return Either.mapBoth(decodeRequest(raw), {
        onLeft: (e) => invalid(raw, e),
        onRight: (message) => ({ _tag: "Request", message }) as const
      })
    }
    return Either.mapBoth(decodeNotification(raw), {
      onLeft: (e) => invalid(raw, e),
      onRight: (message) => ({ _tag: "Notification", message }) as const
    })
  }
  if ("result" in raw && "error" in raw) return Either.left(invalid(raw, "a response has either result or error, not both"))
  if ("error" in raw) {
    return Either.mapBoth(decodeError(raw), {
      onLeft: (e) => invalid(raw, e),
      onRight: (message) => ({ _tag: "Response", message }) as const
    })
  }
  if ("result" in raw) {
    return Either.mapBoth(decodeSuccess(raw), {
      onLeft: (e) => invalid(raw, e),
      onRight: (message) => ({ _tag: "Response", message }) as const
    })
  }
  return Either.left(invalid(raw, "expected method, result or error"))
}

// Hand-written twins of the Schemas above, for the router's hot path: running the Schema decoders
// on every frame cost ~6% of its CPU. Each guard accepts only what its Schema accepts, and only
// objects whose prototype is Object.prototype (what JSON.parse builds), because the Schema decoders
// copy into a fresh plain object, so returning any other input as-is would change the result.
type Fields = Record<string, unknown>

const isPlainObject = (u: unknown): u is Fields => typeof u === "object" && u !== null && Object.getPrototypeOf(u) === Object.prototype
const isVersion = (u: unknown): boolean => u === undefined || u === "2.0"
const isParams = (u: unknown): boolean => u === undefined || Array.isArray(u) || isPlainObject(u)

const isRequest = (m: Fields): m is Fields & Request =>
  isVersion(m["jsonrpc"]) && isId(m["id"]) && typeof m["method"] === "string" && isParams(m["params"])

const isNotification = (m: Fields): m is Fields & Notification =>
  isVersion(m["jsonrpc"]) && typeof m["method"] === "string" && isParams(m["params"])

const isSuccessResponse = (m: Fields): m is Fields & SuccessResponse => isVersion(m["jsonrpc"]) && isId(m["id"]) && "result" in m

// Schema.Int is Number.isSafeInteger, so 2 ** 53 is not an error code.
const isErrorObject = (u: unknown): boolean =>
  isPlainObject(u) && Number.isSafeInteger(u["code"]) && typeof u["message"] === "string"

const isErrorResponse = (m: Fields): m is Fields & ErrorResponse =>
  isVersion(m["jsonrpc"]) && (m["id"] === null || isId(m["id"])) && isErrorObject(m["error"])

/**
 * Accepts only values that are certainly valid, with the same dispatch as `decodeValueWithSchema`.
 * `undefined` means "not sure": ids like Infinity, which Schema.Number accepts, are left to it too.
 */
const decodeFast = (raw: unknown): Incoming | undefined => {
  if (!isPlainObject(raw)) return undefined
  if ("method" in raw) {
    if (raw["id"] !== undefined) return isRequest(raw) ? { _tag: "Request", message: raw } : undefined
    return isNotification(raw) ? { _tag: "Notification", message: raw } : undefined
  }
  if ("error" in raw) return !("result" in raw) && isErrorResponse(raw) ? { _tag: "Response", message: raw } : undefined
  return isSuccessResponse(raw) ? { _tag: "Response", message: raw } : undefined
}

/**
 * Classifies an already-parsed value. Batches are not used by any protocol Switchboard speaks, so
 * an array is an invalid request rather than a batch. A valid message is returned as the object
 * given, extra fields included; anything else goes through the Schemas, which word the -32600.
 */
export const decodeValue = (raw: unknown): Either.Either<Incoming, ErrorResponse> => {
  const fast = decodeFast(raw)
  return fast === undefined ? decodeValueWithSchema(raw) : Either.right(fast)
}

/**
 * Parses one text frame. Invalid JSON, or JSON nested deeper than `Json.MAX_DEPTH`, is -32700 with
 * `id: null`; a wrong shape is -32600.
 */
export const decodeFrame = (text: string): Either.Either<Incoming, ErrorResponse> => {
  const raw = Json.parse(text)
  return Either.isLeft(raw) ? Either.left(errorResponse(null, ErrorCode.ParseError, `Parse error: ${raw.left}`)) : decodeValue(raw.right)
}

export const encode = (message: Message): string =>
  JSON.stringify(message.jsonrpc === undefined ? { jsonrpc: "2.0", ...message } : message)

/**
 * Where a message failed its Schema, in a few words for a peer: the first issue's path and what
 * was wrong there (`name: is missing`). Short enough for a WebSocket close reason (123 bytes).
 */
export const shapeIssue = (error: ParseResult.ParseError): string => {
  const first = ParseResult.ArrayFormatter.formatErrorSync(error)[0]
  if (first === undefined) return "malformed"
  const where = first.path.map(String).join(".")
  const said = where === "" ? first.message : `${where}: ${first.message}`
  return said.length > 60 ? `${said.slice(0, 60)}…` : said
}
