/**
 * What the edge checks of a Streamable HTTP request before any session sees it, and how it says
 * no: every refusal is a JSON-RPC error body, as the MCP SDK's own server sends. Each era of the
 * protocol (sessions, or none) runs the same checks; nothing here knows about sessions or the bus.
 */
import { JsonRpc, Json, Registry } from "@switchboard/protocol"
import * as Either from "effect/Either"
import * as Http from "node:http"
import type { OriginPolicy } from "./OriginPolicy.ts"
import { quoted } from "./OriginPolicy.ts"
import { headerToken, tokenTooLong } from "./Requests.ts"

/** A request refused: the status, and what the body's message says after the status's phrase. */
export interface Refusal {
  readonly status: number
  readonly why?: string | undefined
  readonly headers?: Readonly<Record<string, string>> | undefined
}

/** Whether an Accept header admits `type` (exactly, as `major/*`, or as `*\/*`). */
export const accepts = (accept: string | undefined, type: string): boolean => {
  if (accept === undefined) return false
  // A client sends the same header with every request: the answer is worked out once (for
  // headers of a sane length; any peer can send any header).
  if (accept.length > 256) return admits(accept, type)
  const key = `${type} ${accept}`
  const known = acceptsSeen.get(key)
  if (known !== undefined) return known
  const answer = admits(accept, type)
  if (acceptsSeen.size >= 1024) acceptsSeen.clear()
  acceptsSeen.set(key, answer)
  return answer
}
const acceptsSeen = new Map<string, boolean>()

const admits = (accept: string, type: string): boolean => {
  const major = `${type.slice(0, type.indexOf("/"))}/*`
  return accept.split(",").some((part) => {
    const essence = (part.split(";")[0] ?? "").trim().toLowerCase()
    return essence === type || essence === major || essence === "*/*"
  })
}

/** A Content-Type without its parameters, lowercased (`application/json; charset=utf-8` is `application/json`). */
export const essenceOf = (contentType: string | undefined): string => ((contentType ?? "").split(";")[0] ?? "").trim().toLowerCase()

/** A POST must take both a JSON answer and an SSE stream, and send JSON. */
export const checkPost = (req: Http.IncomingMessage): Refusal | undefined => {
  if (!accepts(req.headers.accept, "application/json") || !accepts(req.headers.accept, "text/event-stream")) {
    return { status: 406, why: "a POST must accept both application/json and text/event-stream" }
  }
  if (essenceOf(req.headers["content-type"]) !== "application/json") return { status: 415, why: "the body must be application/json" }
  return undefined
}

/** A GET opens an SSE stream, so it must accept one. */
export const checkGet = (req: Http.IncomingMessage): Refusal | undefined =>
  accepts(req.headers.accept, "text/event-stream") ? undefined : { status: 406, why: "a GET must accept text/event-stream" }

/** An `MCP-Protocol-Version` the hub does not speak; none at all is the spec's default, and taken. */
export const checkVersion = (req: Http.IncomingMessage): Refusal | undefined => {
  const version = req.headers["mcp-protocol-version"]
  if (typeof version !== "string" || (Registry.HttpProtocolVersions as ReadonlyArray<string>).includes(version)) return undefined
  return { status: 400, why: `unsupported MCP-Protocol-Version ${version} (supported: ${Registry.HttpProtocolVersions.join(", ")})` }
}

/** A page may not reach a user's sessions from a foreign origin. */
export const checkOrigin = (policy: OriginPolicy, req: Http.IncomingMessage): Refusal | undefined => {
  const foreign = policy.checkOrigin(req.headers.origin)
  return foreign === undefined ? undefined : { status: foreign.status, why: foreign.message }
}

/** Why a request's bearer token is refused before it is verified (401), or the token. */
export type Bearer =
  | { readonly _tag: "Token"; readonly token: string }
  | { readonly _tag: "Refused"; readonly why: string; readonly invalid: boolean }

/** The bearer token of the `Authorization` header: none is a 401, and so is one longer than `maxTokenBytes`. */
export const bearer = (req: Http.IncomingMessage, maxTokenBytes: number): Bearer => {
  const token = headerToken(req)
  if (token === undefined) return { _tag: "Refused", why: "a bearer token is required (Authorization header)", invalid: false }
  const tooLong = tokenTooLong(token, maxTokenBytes)
  return tooLong === undefined ? { _tag: "Token", token } : { _tag: "Refused", why: `invalid token: ${tooLong}`, invalid: true }
}

/** A JSON-RPC error body: an answer to `id`, or to nobody. */
export const failureBody = (code: number, message: string, id: JsonRpc.Id | null = null): string => JsonRpc.encode(JsonRpc.errorResponse(id, code, message))

/** Every answer but a success: a JSON-RPC error body. A response already begun can only be cut. */
export const fail = (res: Http.ServerResponse, status: number, code: number, message: string, headers: Readonly<Record<string, string>> = {}) => {
  if (res.headersSent) return void res.destroy()
  const body = failureBody(code, message)
  res.writeHead(status, { ...headers, "content-type": "application/json", "content-length": Buffer.byteLength(body) })
  res.end(body)
}

/**
 * A refusal whose status says what is wrong: the message opens with the status's reason phrase
 * (Node's own `STATUS_CODES`), then says why, if there is more to say.
 */
export const refuse = (res: Http.ServerResponse, refusal: Refusal) => {
  const phrase = Http.STATUS_CODES[refusal.status] ?? `HTTP ${refusal.status}`
  fail(res, refusal.status, JsonRpc.ErrorCode.ServerError, refusal.why === undefined ? phrase : `${phrase}: ${refusal.why}`, refusal.headers)
}

/** A 401 whose `WWW-Authenticate` names the resource metadata, where a client finds how to get a token (RFC 9728). */
export const unauthorized = (res: Http.ServerResponse, metadataUrl: string, why: string, invalid: boolean) =>
  refuse(res, {
    status: 401,
    why,
    headers: { "www-authenticate": `Bearer${invalid ? ` error="invalid_token",` : ""} resource_metadata=${quoted(metadataUrl)}` }
  })

/**
 * Reads a request's body, at most `maxBody` bytes: a larger one (declared or sent) is answered 413
 * and its connection closed, and `then` never runs.
 */
export const readBody = (req: Http.IncomingMessage, res: Http.ServerResponse, maxBody: number, then: (body: Buffer) => void) => {
  const tooLarge = () => refuse(res, { status: 413, why: `a message may have at most ${maxBody} bytes`, headers: { connection: "close" } })
  const declared = Number(req.headers["content-length"] ?? 0)
  if (declared > maxBody) return tooLarge()
  const chunks: Array<Buffer> = []
  let size = 0
  let over = false
  req.on("data", (chunk: Buffer) => {
    if (over) return
    size += chunk.byteLength
    if (size > maxBody) {
      over = true
      chunks.length = 0
      tooLarge()
    } else chunks.push(chunk)
  })
  req.on("end", () => {
    if (!over) then(Buffer.concat(chunks))
  })
}

/** One JSON-RPC message as a POST carries it; a request's id, when it is a request (it then waits for its answer). */
export interface Received {
  readonly message: Readonly<Record<string, unknown>>
  readonly method: string | undefined
  readonly id: JsonRpc.Id | undefined
}

/** A refusal with a JSON-RPC code of its own (a parse error is -32700, not the server error of `refuse`). */
export interface Malformed {
  readonly status: 400
  readonly code: number
  readonly message: string
}

/** A POST's body as one JSON-RPC message: not JSON, a batch, or not an object is a 400. */
export const parseMessage = (body: Buffer): Either.Either<Received, Malformed> => {
  const parsed = Json.parse(body.toString("utf8"))
  if (Either.isLeft(parsed)) return Either.left({ status: 400, code: JsonRpc.ErrorCode.ParseError, message: `Parse error: ${parsed.left}` })
  const message = parsed.right
  if (Array.isArray(message)) {
    return Either.left({ status: 400, code: JsonRpc.ErrorCode.InvalidRequest, message: "Invalid Request: batches are not supported; send one message per POST" })
  }
  if (!JsonRpc.isRecord(message)) {
    return Either.left({ status: 400, code: JsonRpc.ErrorCode.InvalidRequest, message: "Invalid Request: expected a JSON-RPC message object" })
  }
  const rawId = message["id"]
  const method = typeof message["method"] === "string" ? message["method"] : undefined
  // Requests wait for their answer; notifications and responses are accepted at once.
  const id = method !== undefined && (typeof rawId === "string" || typeof rawId === "number") ? rawId : undefined
  return Either.right({ message, method, id })
}
