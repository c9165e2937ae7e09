/**
 * Streamable HTTP's request checks through their own interface, each behind a real `node:http`
 * server on loopback: the hub's order of checks (Origin, version, token, then the method's) with
 * a 200 for what passes, so each refusal is seen as a client sees it.
 */
import { describe, expect, it } from "@effect/vitest"
import { JsonRpc } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Http from "node:http"
import * as Checks from "../src/HttpChecks.ts"
import * as OriginPolicy from "../src/OriginPolicy.ts"
import { listen } from "./support.ts"

const MAX_BODY = 64
const METADATA = "http://127.0.0.1/.well-known/oauth-protected-resource"
const policy = OriginPolicy.make({ allowedOrigins: Option.some(["https://app.example"]), bindAddress: "127.0.0.1", publicUrl: Option.none() })

/** The checks in the hub's order; a request that passes them all is answered 200 with what it carried. */
const gate = (req: Http.IncomingMessage, res: Http.ServerResponse) => {
  const refused = Checks.checkOrigin(policy, req) ?? Checks.checkVersion(req)
  if (refused !== undefined) return Checks.refuse(res, refused)
  const bearer = Checks.bearer(req, 32)
  if (bearer._tag === "Refused") return Checks.unauthorized(res, METADATA, bearer.why, bearer.invalid)
  if (req.method === "GET") {
    const notStream = Checks.checkGet(req)
    return notStream === undefined ? void res.writeHead(200).end("stream") : Checks.refuse(res, notStream)
  }
  const notPost = Checks.checkPost(req)
  if (notPost !== undefined) return Checks.refuse(res, notPost)
  Checks.readBody(req, res, MAX_BODY, (body) => {
    const parsed = Checks.parseMessage(body)
    if (Either.isLeft(parsed)) return Checks.fail(res, parsed.left.status, parsed.left.code, parsed.left.message)
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ id: parsed.right.id ?? null, method: parsed.right.method ?? null }))
  })
}

interface Answer {
  readonly status: number
  readonly body: string
  readonly headers: Headers
}

const POST_HEADERS = { accept: "application/json, text/event-stream", "content-type": "application/json", authorization: "Bearer t0ken" }

const send = (url: string, init: RequestInit) =>
  Effect.promise(async (): Promise<Answer> => {
    const res = await fetch(url, init)
    return { status: res.status, body: await res.text(), headers: res.headers }
  })

/** A refusal's status, JSON-RPC code and message. */
const refusal = (a: Answer) => {
  const body = JSON.parse(a.body) as { readonly id: unknown; readonly error: { readonly code: number; readonly message: string } }
  return { status: a.status, id: body.id, code: body.error.code, message: body.error.message }
}

const post = (url: string, body: string, headers: Readonly<Record<string, string>> = {}) => send(url, { method: "POST", body, headers: { ...POST_HEADERS, ...headers } })

const serve = listen({ onRequest: gate }).pipe(Effect.map((s) => s.http))

describe("Streamable HTTP's request checks", () => {
  it.scopedLive("pass a well-formed request, and say what kind of message it is", () =>
    Effect.gen(function*() {
      const url = yield* serve
      const answer = yield* post(url, JSON.stringify({ jsonrpc: "2.0", id: 7, method: "tools/list" }), { "mcp-protocol-version": "2025-11-25" })
      expect([answer.status, JSON.parse(answer.body)]).toEqual([200, { id: 7, method: "tools/list" }])
      const notification = yield* post(url, JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }), { accept: "*/*" })
      expect(JSON.parse(notification.body)).toEqual({ id: null, method: "notifications/initialized" })
      expect((yield* send(url, { headers: { accept: "text/*", authorization: "Bearer t0ken" } })).status).toBe(200)
    }))

  it.scopedLive("refuse 406 a POST or GET that does not accept what it may get, and 415 a body that is not JSON", () =>
    Effect.gen(function*() {
      const url = yield* serve
      expect(refusal(yield* post(url, "{}", { accept: "application/json" }))).toEqual({
        status: 406,
        id: null,
        code: JsonRpc.ErrorCode.ServerError,
        message: "Not Acceptable: a POST must accept both application/json and text/event-stream"
      })
      expect(refusal(yield* send(url, { headers: { accept: "application/json", authorization: "Bearer t0ken" } })).message).toBe(
        "Not Acceptable: a GET must accept text/event-stream"
      )
      expect(refusal(yield* post(url, "{}", { "content-type": "text/plain; charset=utf-8" }))).toMatchObject({
        status: 415,
        message: "Unsupported Media Type: the body must be application/json"
      })
      // Parameters and case do not change a media type.
      expect((yield* post(url, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\"}", { "content-type": "Application/JSON; charset=utf-8" })).status).toBe(200)
    }))

  it.scopedLive("refuse 413 a body over the bound, declared or sent, and close its connection", () =>
    Effect.gen(function*() {
      const url = yield* serve
      const declared = yield* post(url, JSON.stringify({ jsonrpc: "2.0", id: 1, method: "x", params: { pad: "x".repeat(MAX_BODY) } }))
      expect(refusal(declared)).toMatchObject({ status: 413, message: `Payload Too Large: a message may have at most ${MAX_BODY} bytes` })
      expect(declared.headers.get("connection")).toBe("close")
      // Chunked: no Content-Length to refuse it by, so the bytes are counted as they come.
      const sent = yield* Effect.async<{ readonly status: number; readonly body: string }>((resume) => {
        const req = Http.request(url, { method: "POST", headers: { ...POST_HEADERS, "transfer-encoding": "chunked" } }, (res) => {
          let body = ""
          res.setEncoding("utf8").on("data", (c: string) => (body += c)).on("end", () => resume(Effect.succeed({ status: res.statusCode ?? 0, body })))
        })
        req.on("error", () => {})
        req.write("x".repeat(MAX_BODY + 1))
        req.end()
      })
      expect(sent.status).toBe(413)
    }))

  it.scopedLive("refuse 400 a body that is not JSON, a batch, or not a message object, each with its JSON-RPC code", () =>
    Effect.gen(function*() {
      const url = yield* serve
      const parse = refusal(yield* post(url, "{not json"))
      expect([parse.status, parse.code]).toEqual([400, JsonRpc.ErrorCode.ParseError])
      expect(parse.message).toMatch(/^Parse error: /)
      expect(refusal(yield* post(url, "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\"}]"))).toEqual({
        status: 400,
        id: null,
        code: JsonRpc.ErrorCode.InvalidRequest,
        message: "Invalid Request: batches are not supported; send one message per POST"
      })
      expect(refusal(yield* post(url, "42"))).toMatchObject({
        status: 400,
        code: JsonRpc.ErrorCode.InvalidRequest,
        message: "Invalid Request: expected a JSON-RPC message object"
      })
    }))

  it.scopedLive("refuse 401 a request without a bearer token, or with one over the bound, naming the resource metadata", () =>
    Effect.gen(function*() {
      const url = yield* serve
      const missing = yield* post(url, "{}", { authorization: "" })
      expect(refusal(missing)).toMatchObject({ status: 401, message: "Unauthorized: a bearer token is required (Authorization header)" })
      expect(missing.headers.get("www-authenticate")).toBe(`Bearer resource_metadata="${METADATA}"`)
      const long = yield* post(url, "{}", { authorization: `Bearer ${"t".repeat(33)}` })
      expect(refusal(long)).toMatchObject({ status: 401, message: "Unauthorized: invalid token: token too long: 33 bytes, at most 32" })
      expect(long.headers.get("www-authenticate")).toBe(`Bearer error="invalid_token", resource_metadata="${METADATA}"`)
    }))

  it.scopedLive("refuse 400 an MCP-Protocol-Version the hub does not speak, and 403 a foreign Origin", () =>
    Effect.gen(function*() {
      const url = yield* serve
      const version = refusal(yield* post(url, "{}", { "mcp-protocol-version": "1999-01-01" }))
      expect([version.status, version.code]).toEqual([400, JsonRpc.ErrorCode.ServerError])
      expect(version.message).toMatch(/^Bad Request: unsupported MCP-Protocol-Version 1999-01-01 \(supported: .*2025-11-25/)
      expect(refusal(yield* post(url, "{}", { origin: "https://evil.example" }))).toMatchObject({
        status: 403,
        message: "Forbidden: origin https://evil.example is not allowed"
      })
      expect((yield* post(url, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\"}", { origin: "https://app.example" })).status).toBe(200)
    }))
})
