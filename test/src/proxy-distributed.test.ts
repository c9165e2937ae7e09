/**
 * The MCP Proxy Protocol deployed as it runs in production: auth, router and two edges as separate
 * OS processes on a real NATS, real sockets. The extension sits on edge A and the MCP clients on
 * edge B, so every forwarded request and answer crosses processes. Logic-level edge cases live in
 * the embedded-bus tests; these check that the pieces hold together.
 */
import { describe, expect, it } from "@effect/vitest"
import { NatsServer } from "@switchboard/testing"
import * as Effect from "effect/Effect"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import * as Processes from "./support/Processes.ts"
import { attach, call, client, extension, extensionOf, next } from "./support/ProxyPeers.ts"
import { token } from "./support/Stack.ts"

const decode = <A, I>(schema: Schema.Schema<A, I>) => (u: unknown) => Schema.decodeUnknown(schema)(u).pipe(Effect.orDie)

const Connected = Schema.Struct({ result: Schema.Struct({ connection_id: Schema.String }) })
/** A request as the extension receives it: the id is always the router's mapped string. */
const Forwarded = Schema.Struct({ id: Schema.String, method: Schema.String, params: Schema.Unknown })

const deploy = Effect.gen(function*() {
  const { url } = yield* NatsServer
  const { edges: [a, b] } = yield* Processes.deployment(url, { edges: 2 })
  if (a === undefined || b === undefined) return yield* Effect.dieMessage("the deployment has fewer than two edges")
  return { a, b }
})

/**
 * Each test gets a NATS of its own (one that goes away takes only its test down), and its
 * processes stop before their NATS does.
 */
const withNats = <A, E>(test: Effect.Effect<A, E, NatsServer | Scope.Scope>) => Effect.scoped(test).pipe(Effect.provide(NatsServer.layer))

describe("MCP proxy across processes", () => {
  it.live("an extension on edge A serves a client on edge B; ids come back with their own type", () =>
    Effect.gen(function*() {
      const { a, b } = yield* deploy
      const ext = yield* extensionOf(a.ws, "alice", "Chrome 141")
      const c = yield* client(b.ws, "alice")
      expect(yield* call(c, 2, "list_extensions")).toEqual({
        jsonrpc: "2.0",
        id: 2,
        result: { extensions: [{ id: ext.id, name: "Chrome 141", connected: true }] }
      })
      const connected = yield* call(c, 3, "connect", { extension_id: ext.id })
      expect(connected).toEqual({
        jsonrpc: "2.0",
        id: 3,
        result: { connection_id: expect.stringMatching(/^conn-/), extension_id: ext.id, extension_name: "Chrome 141" }
      })
      const { result: { connection_id: connectionId } } = yield* decode(Connected)(connected)

      const roundTrip = (id: number | string, answer: object) =>
        Effect.gen(function*() {
          const params = { url: "https://example.com", stealth: true }
          // The spec's routing field: the router must strip it.
          c.send({ jsonrpc: "2.0", id, method: "createTab", params, connectionId })
          const forwarded = yield* next(ext.c)
          expect(forwarded).toEqual({ jsonrpc: "2.0", id: `${connectionId}:${id}`, method: "createTab", params })
          ext.c.send({ jsonrpc: "2.0", id: `${connectionId}:${id}`, ...answer })
          return yield* next(c)
        })

      // toEqual tells 100 from "100": the id must come back as the client sent it.
      expect(yield* roundTrip(100, { result: { tabId: 42, url: "https://example.com" } })).toEqual({
        jsonrpc: "2.0",
        id: 100,
        result: { tabId: 42, url: "https://example.com" }
      })
      const uuid = randomUUID()
      expect(yield* roundTrip(uuid, { result: { tabId: 43 } })).toEqual({ jsonrpc: "2.0", id: uuid, result: { tabId: 43 } })
      const error = { code: -32000, message: "Tab creation failed: Permission denied" }
      expect(yield* roundTrip(101, { error })).toEqual({ jsonrpc: "2.0", id: 101, error })
    }).pipe(withNats), 120_000)

  it.live("three clients with colliding ids, all in flight at once, each get exactly their own answers", () =>
    Effect.gen(function*() {
      const { a, b } = yield* deploy
      const ext = yield* extensionOf(a.ws, "alice", "Chrome 141")
      const clients = yield* Effect.forEach([0, 1, 2], () =>
        Effect.gen(function*() {
          const c = yield* client(b.ws, "alice")
          return { c, connectionId: yield* attach(c, ext.id) }
        }))
      const ids: ReadonlyArray<number | string> = [1, 2, 3, "550e8400-e29b-41d4-a716-446655440000"]
      clients.forEach(({ c }, client) => ids.forEach((id) => c.send({ jsonrpc: "2.0", id, method: "createTab", params: { client, sent: id } })))

      // Every request reaches the extension before any answer leaves it.
      const forwarded = yield* Effect.forEach(ids.flatMap(() => clients), () => Effect.flatMap(next(ext.c), decode(Forwarded)))
      expect(new Set(forwarded.map((f) => f.id)).size).toBe(clients.length * ids.length)
      expect(forwarded.map((f) => f.id).sort()).toEqual(clients.flatMap(({ connectionId }) => ids.map((id) => `${connectionId}:${id}`)).sort())
      // Answered in reverse: matching must not depend on order.
      for (const f of [...forwarded].reverse()) ext.c.send({ jsonrpc: "2.0", id: f.id, result: f.params })

      yield* Effect.forEach(
        clients,
        ({ c }, client) =>
          Effect.gen(function*() {
            const got = yield* Effect.forEach(ids, () => next(c))
            const expected = ids.map((id) => ({ jsonrpc: "2.0", id, result: { client, sent: id } }))
            expect(got).toHaveLength(expected.length)
            expect(got).toEqual(expect.arrayContaining(expected))
          }),
        { concurrency: "unbounded" }
      )
    }).pipe(withNats), 120_000)

  it.live("the extension disconnecting tells every client its connection_id and fails their pending requests at once", () =>
    Effect.gen(function*() {
      const { a, b } = yield* deploy
      const ext = yield* extensionOf(a.ws, "alice", "Chrome 141")
      const clients = yield* Effect.forEach([0, 1], () =>
        Effect.gen(function*() {
          const c = yield* client(b.ws, "alice")
          return { c, connectionId: yield* attach(c, ext.id) }
        }))
      const uuid = randomUUID()
      clients.forEach(({ c }) => {
        c.send({ jsonrpc: "2.0", id: 7, method: "createTab", params: {} })
        c.send({ jsonrpc: "2.0", id: uuid, method: "getTabs", params: {} })
      })
      // Once the extension holds all four, all four are pending in the router.
      yield* Effect.forEach(Array.from({ length: 4 }), () => next(ext.c))

      const closedAt = Date.now()
      ext.c.ws.close(1000, "browser closed")
      yield* Effect.forEach(
        clients,
        ({ c, connectionId }) =>
          Effect.gen(function*() {
            const got = yield* Effect.forEach(Array.from({ length: 3 }), () => next(c))
            const failed = { code: -32000, message: expect.stringContaining("Extension disconnected") }
            expect(got).toEqual(
              expect.arrayContaining([
                { jsonrpc: "2.0", id: 7, error: failed },
                { jsonrpc: "2.0", id: uuid, error: failed },
                { jsonrpc: "2.0", method: "disconnected", params: { connection_id: connectionId, reason: "Extension closed" } }
              ])
            )
          }),
        { concurrency: "unbounded" }
      )
      // The router's request timeout is 120 s: these failures came from the disconnect.
      expect(Date.now() - closedAt).toBeLessThan(5_000)

      const [first] = clients
      if (first === undefined) return
      expect(yield* call(first.c, 8, "list_extensions")).toEqual({ jsonrpc: "2.0", id: 8, result: { extensions: [] } })
      expect(yield* call(first.c, 9, "createTab")).toMatchObject({ jsonrpc: "2.0", id: 9, error: { code: -32000 } })
    }).pipe(withNats), 120_000)

  it.live("users are isolated across edges: bob neither sees nor reaches alice's extension", () =>
    Effect.gen(function*() {
      const { a, b } = yield* deploy
      const alicesExtension = yield* extensionOf(a.ws, "alice", "Alice's Chrome")
      const bobsExtension = yield* extensionOf(a.ws, "bob", "Bob's Chrome")
      const bob = yield* client(b.ws, "bob")
      expect(yield* call(bob, 2, "list_extensions")).toEqual({
        jsonrpc: "2.0",
        id: 2,
        result: { extensions: [{ id: bobsExtension.id, name: "Bob's Chrome", connected: true }] }
      })
      expect(yield* call(bob, 3, "connect", { extension_id: alicesExtension.id })).toEqual({
        jsonrpc: "2.0",
        id: 3,
        error: { code: -32000, message: "Extension not found or not accessible" }
      })
      expect(yield* call(bob, 4, "createTab")).toEqual({
        jsonrpc: "2.0",
        id: 4,
        error: { code: -32000, message: "Not connected to an extension" }
      })

      // Alice's own request is the first thing her extension receives: nothing of bob's got there.
      const alice = yield* client(b.ws, "alice")
      const connectionId = yield* attach(alice, alicesExtension.id)
      alice.send({ jsonrpc: "2.0", id: 4, method: "createTab", params: { url: "https://alice.example" } })
      expect(yield* next(alicesExtension.c)).toEqual({
        jsonrpc: "2.0",
        id: `${connectionId}:4`,
        method: "createTab",
        params: { url: "https://alice.example" }
      })
    }).pipe(withNats), 120_000)

  it.live("a browser back through another edge after its edge died replaces its old socket at once; clients hear it", () =>
    Effect.gen(function*() {
      const { a, b } = yield* deploy
      const accessToken = yield* token({ sub: "alice" })
      const first = yield* extension(a.ws, { name: "Chrome", accessToken, client_id: "browser-1" })
      const c = yield* client(b.ws, "alice")
      const connectionId = yield* attach(c, first.id)
      // Edge A dies without a word: only its heartbeat, 15 s from now, would say so.
      yield* a.kill("SIGKILL")
      yield* a.exited
      const second = yield* extension(b.ws, { name: "Chrome", accessToken, client_id: "browser-1" })
      expect(second.id).toBe(first.id)
      // The client attached to the old socket learns it is gone, well before the edge's key lapses.
      const started = Date.now()
      const gone = yield* next(c).pipe(
        Effect.repeat({ until: (m) => m.method === "disconnected" }),
        Effect.timeoutFail({ duration: "5 seconds", onTimeout: () => new Error("the client never heard that the old socket was replaced") })
      )
      expect(gone.params).toEqual({ connection_id: connectionId, reason: "Extension reconnected" })
      yield* Effect.logInfo(`disconnected after ${Date.now() - started} ms`)
      // And it reaches the browser again through the new socket.
      yield* attach(c, second.id, 3)
      c.send({ jsonrpc: "2.0", id: 4, method: "getTabs" })
      expect(((yield* next(second.c)) as { method?: string }).method).toBe("getTabs")
    }).pipe(withNats), 120_000)
})
