/** The `/extension` actor alone, on the embedded bus: authenticate, and what the proxy keeps of it in KV. */
import { describe, expect, it } from "@effect/vitest"
import { Kv, Subjects } from "@switchboard/bus"
import { Proxy } from "@switchboard/protocol"
import * as ActorClient from "@switchboard/testing/ActorClient"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { extension, next, token, withRouter } from "./Harness.ts"

const EXTENSION_ID = /^ext-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

const extensionRecord = (user: string, id: string) =>
  Effect.gen(function*() {
    const kv = yield* Kv.Kv
    const records = Kv.typed(yield* Effect.orDie(kv.bucket(Subjects.Bucket.extensions)), Proxy.ExtensionRecord)
    return Option.map(yield* Effect.orDie(records.get(Subjects.Key.userExtension(user, id))), (e) => e.value)
  })

/** A fresh `/extension` socket, past the proxy's `authenticate` request. */
const asked = Effect.gen(function*() {
  const client = yield* ActorClient.open("router", { path: "/extension" })
  expect(yield* next(client)).toEqual({ jsonrpc: "2.0", id: "proxy:1", method: "authenticate", params: {} })
  return client
})

describe("the extension session", () => {
  it.live("asks authenticate, and lists an extension that answers with a valid token under its user", () =>
    withRouter(Effect.gen(function*() {
      const client = yield* asked
      yield* client.send({ jsonrpc: "2.0", id: "proxy:1", result: { name: "Chrome 141", accessToken: yield* token("alice") } })
      const authenticated = yield* next(client)
      expect(authenticated).toEqual({
        jsonrpc: "2.0",
        method: "authenticated",
        params: { user_id: "alice", extension_id: expect.stringMatching(EXTENSION_ID) }
      })
      expect(yield* next(client)).toMatchObject({ method: "status", params: { connected: true, peer_count: 0 } })
      const id = String(authenticated.params?.["extension_id"])
      expect(yield* extensionRecord("alice", id)).toEqual(
        Option.some({ id, name: "Chrome 141", user: "alice", conn: client.conn, edge: client.edge, connectedAt: expect.any(Number) })
      )
    })))

  it.live("takes access_token too; the same client_id keeps its extension id, and the newer socket replaces the older", () =>
    withRouter(Effect.gen(function*() {
      const first = yield* extension("alice", { clientId: "browser-1" })
      const second = yield* asked
      yield* second.send({ jsonrpc: "2.0", id: "proxy:1", result: { name: "Chrome 141", access_token: yield* token("alice"), client_id: "browser-1" } })
      expect((yield* next(second)).params).toEqual({ user_id: "alice", extension_id: first.id })
      expect(yield* first.client.closedByService).toEqual({ code: 1000, reason: "replaced by a newer connection" })
      expect(Option.map(yield* extensionRecord("alice", first.id), (r) => r.conn)).toEqual(Option.some(second.conn))
    })))

  // A chaos run (an edge SIGKILLed under load): the old socket's actor read its record, the
  // browser's new socket wrote its own, and the old actor's delete then took that one, so every
  // `connect` to the extension answered not found for minutes.
  it.live("a closing socket leaves the record that the same browser's newer socket wrote while it let go", () =>
    Effect.gen(function*() {
      const deleting = yield* Deferred.make<void>()
      const gate = yield* Deferred.make<void>()
      // Deletes of extension records wait for the gate, once they have read what they delete.
      const held = (kv: Kv.KvShape): Kv.KvShape => ({
        bucket: (spec) =>
          Effect.map(kv.bucket(spec), (bucket) => {
            if (spec.name !== Subjects.Bucket.extensions.name) return bucket
            const hold = <A, E>(effect: Effect.Effect<A, E>) => Effect.zipRight(Effect.zipRight(Deferred.succeed(deleting, undefined), Deferred.await(gate)), effect)
            return { ...bucket, delete: (key) => hold(bucket.delete(key)), compareAndDelete: (key, revision) => hold(bucket.compareAndDelete(key, revision)) }
          })
      })
      yield* withRouter(
        Effect.gen(function*() {
          const first = yield* extension("alice", { clientId: "browser-1" })
          yield* first.client.close(1006, "")
          yield* Deferred.await(deleting)
          const second = yield* extension("alice", { clientId: "browser-1" })
          expect(second.id).toBe(first.id)
          yield* Deferred.succeed(gate, undefined)
          yield* first.client.ended
          expect(Option.map(yield* extensionRecord("alice", first.id), (r) => r.conn)).toEqual(Option.some(second.client.conn))
        }),
        {},
        held
      )
    }))

  it.live("closes with 1008 when the extension refuses authenticate, or its token does not verify", () =>
    withRouter(Effect.gen(function*() {
      const refusing = yield* asked
      yield* refusing.send({ jsonrpc: "2.0", id: "proxy:1", error: { code: -32000, message: "no token stored" } })
      expect(yield* refusing.closedByService).toEqual({ code: 1008, reason: "Authentication failed: authenticate was refused" })

      const forged = yield* asked
      yield* forged.send({ jsonrpc: "2.0", id: "proxy:1", result: { name: "Chrome 141", accessToken: `${yield* token("alice")}x` } })
      const closed = yield* forged.closedByService
      expect(closed.code).toBe(1008)
      expect(closed.reason).toMatch(/^Authentication failed: /)
      expect(closed.reason).not.toContain("expected {name, accessToken}")
    })))

  it.live("closes with 1008, saying which field is wrong, when authenticate's result has a bad shape", () =>
    withRouter(Effect.gen(function*() {
      const reasonFor = (result: unknown) =>
        Effect.gen(function*() {
          const client = yield* asked
          yield* client.send({ jsonrpc: "2.0", id: "proxy:1", result })
          return yield* client.closedByService
        })
      const good = yield* token("alice")
      expect(yield* reasonFor({ accessToken: good })).toEqual({ code: 1008, reason: "Authentication failed: expected {name, accessToken} (name: is missing)" })
      expect(yield* reasonFor({ name: 42, accessToken: good })).toEqual({
        code: 1008,
        reason: "Authentication failed: expected {name, accessToken} (name: Expected string, actual 42)"
      })
      expect(yield* reasonFor({ name: "Chrome 141" })).toEqual({
        code: 1008,
        reason: "Authentication failed: expected {name, accessToken} (accessToken is required)"
      })
      expect(yield* reasonFor({ name: "Chrome 141", accessToken: 7 })).toEqual({
        code: 1008,
        reason: "Authentication failed: expected {name, accessToken} (accessToken: Expected string, actual 7)"
      })
      expect(yield* reasonFor("a token")).toMatchObject({ code: 1008, reason: expect.stringMatching(/^Authentication failed: expected \{name, accessToken\} \(Expected /) })
    })))

  it.live("closes with 1008 an extension that does not answer authenticate in time", () =>
    withRouter(
      Effect.gen(function*() {
        const silent = yield* asked
        expect(yield* silent.closedByService).toEqual({ code: 1008, reason: "Authentication failed: no answer to authenticate" })
        yield* silent.ended
      }),
      { ROUTER_AUTH_TIMEOUT: "200 millis" }
    ))
})
