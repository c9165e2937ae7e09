/**
 * The two peers of the MCP Proxy Protocol as tests drive them: a passive extension that answers
 * `authenticate`, and an MCP client that has done `mcp_handshake`. `status` keepalives arrive
 * whenever peers come and go, so `next` skips them.
 */
import { expect } from "@effect/vitest"
import * as Effect from "effect/Effect"
import { connect, type TestClient } from "./Client.ts"
import { token } from "./Stack.ts"

export type Message = Record<string, unknown> & {
  readonly id?: unknown
  readonly method?: string
  readonly params?: Record<string, unknown>
  readonly result?: unknown
  readonly error?: unknown
}

const isStatus = (m: Message) => m.method === "status" && !("id" in m)

/** The next message that is not a `status` keepalive. */
export const next = (c: TestClient): Effect.Effect<Message> =>
  Effect.flatMap(c.next, (m) => (isStatus(m as Message) ? next(c) : Effect.succeed(m as Message)))

export const nextStatus = (c: TestClient): Effect.Effect<Message> =>
  Effect.flatMap(c.next, (m) => (isStatus(m as Message) ? Effect.succeed(m as Message) : nextStatus(c)))

/** Sends a request and returns the next message that is not a keepalive. */
export const call = (c: TestClient, id: unknown, method: string, params: object = {}, extra: object = {}) =>
  Effect.suspend(() => {
    c.send({ jsonrpc: "2.0", id, method, params, ...extra })
    return next(c)
  })

/** An extension at `ws` (an edge's ws:// base URL) that authenticates with `answer`. */
export const extension = (ws: string, answer: Record<string, unknown>) =>
  Effect.gen(function*() {
    const c = yield* connect(`${ws}/extension`)
    expect(yield* next(c)).toEqual({ jsonrpc: "2.0", id: "proxy:1", method: "authenticate", params: {} })
    c.send({ jsonrpc: "2.0", id: "proxy:1", result: answer })
    const authenticated = yield* next(c)
    expect(authenticated).toEqual({
      jsonrpc: "2.0",
      method: "authenticated",
      params: { user_id: expect.any(String), extension_id: expect.stringMatching(/^ext-/) }
    })
    return { c, id: authenticated.params!["extension_id"] as string, userId: authenticated.params!["user_id"] as string }
  })

/** The usual extension: a named browser of `user`. */
export const extensionOf = (ws: string, user: string, name = "Chrome 141") =>
  Effect.flatMap(token({ sub: user }), (accessToken) => extension(ws, { name, accessToken }))

/** An MCP client at `ws` that has completed `mcp_handshake` as `user`. */
export const client = (ws: string, user: string) =>
  Effect.gen(function*() {
    const c = yield* connect(`${ws}/mcp`)
    expect(yield* call(c, 1, "mcp_handshake", { accessToken: yield* token({ sub: user }) })).toEqual({
      jsonrpc: "2.0",
      id: 1,
      result: { authenticated: true, user_id: user, mcp_client_id: expect.stringMatching(/^mcp-/) }
    })
    return c
  })

/** Connects a client to an extension and returns the connection id. */
export const attach = (c: TestClient, extensionId: string, id: unknown = 2) =>
  Effect.map(call(c, id, "connect", { extension_id: extensionId }), (m) => {
    expect(m.result).toMatchObject({ connection_id: expect.stringMatching(/^conn-/), extension_id: extensionId })
    return (m.result as Record<string, unknown>)["connection_id"] as string
  })

/** `user`'s extension and one client connected to it: the state most proxy tests start from. */
export const connected = (ws: string, user = "alice") =>
  Effect.gen(function*() {
    const ext = yield* extensionOf(ws, user)
    const mcp = yield* client(ws, user)
    return { ext, mcp, connectionId: yield* attach(mcp, ext.id) }
  })

/** Answers every forwarded request with its own method and params, until the scope closes. */
export const echoing = (ext: TestClient) =>
  Effect.gen(function*() {
    const m = yield* next(ext)
    ext.send({ jsonrpc: "2.0", id: m.id, result: { method: m.method, params: m.params } })
  }).pipe(Effect.forever, Effect.forkScoped)

/**
 * Waits until the actor of extension `ext` has handled every frame `ext` sent before: an actor
 * handles a socket's frames in order, and the proxy refuses any request from an extension, so the
 * refusal of this one comes after all of them.
 */
export const handled = (ext: TestClient) =>
  Effect.map(call(ext, "handled?", "handled?"), (m) => {
    expect(m).toMatchObject({ id: "handled?", error: { code: -32601 } })
  })
