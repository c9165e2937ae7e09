/**
 * What KV keeps of a connection, on the embedded KV: a service's session record round-trips
 * (remember, recall, forget); the host's ownership record is written before the edge hears "ok",
 * moves to another replica only compare-and-set from the replica named, and goes when the
 * connection closes.
 */
import { describe, expect, it } from "@effect/vitest"
import * as ActorClient from "@switchboard/testing/ActorClient"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { randomUUID } from "node:crypto"
import * as Actors from "../src/Actors.ts"
import { Kv, typed } from "../src/Kv.ts"
import { ConnectionRecord, encodeConnectionRecord, ownership } from "../src/SessionStore.ts"
import * as Subjects from "../src/Subjects.ts"
import { onEmbeddedBus, recordingHost, within } from "./hosting.ts"

const Session = Schema.Struct({ initialized: Schema.Boolean, tools: Schema.Array(Schema.String) })

const bucket = <A, I>(name: string, schema: Schema.Schema<A, I>) =>
  Effect.flatMap(Kv, (kv) => Effect.map(Effect.orDie(kv.bucket({ name })), (b) => typed(b, schema)))

describe("the session store (embedded KV)", () => {
  it.live("a session record round-trips: remember, recall, forget", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const sessions = yield* bucket(`sessions-${randomUUID()}`, Session)
      const store = Actors.sessionStore(sessions)
      const conn = { id: Subjects.ConnId(randomUUID()) }
      expect(yield* store.recall(conn)).toEqual(Option.none())
      yield* store.remember(conn, { initialized: true, tools: ["a", "b"] })
      expect(yield* store.recall(conn)).toEqual(Option.some({ initialized: true, tools: ["a", "b"] }))
      // Kept under the session key, where another replica's store finds it.
      expect(yield* Effect.orDie(sessions.keys())).toEqual([Subjects.Key.session(conn.id)])
      yield* store.remember(conn, { initialized: true, tools: [] })
      expect(yield* store.recall(conn)).toEqual(Option.some({ initialized: true, tools: [] }))
      yield* store.forget(conn)
      expect(yield* store.recall(conn)).toEqual(Option.none())
      // Forgetting what is not there is no failure either.
      yield* store.forget(conn)
    })))

  it.live("ownership moves only from the replica it names, compare-and-set", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const owners = ownership(yield* bucket(`connections-${randomUUID()}`, Actors.ConnectionRecord))
      const conn = Subjects.ConnId(randomUUID())
      const open = { path: "/own", query: {}, openedAt: 1 }
      expect(yield* owners.claim(conn, "old", "new")).toBe(false)
      yield* owners.record(conn, { service: "echo", replica: "old", edge: "edge-1", open })
      expect(yield* owners.claim(conn, "someone else", "new")).toBe(false)
      expect(yield* owners.claim(conn, "old", "new")).toBe(true)
      expect(yield* Effect.orDie(owners.bucket.get(conn)).pipe(Effect.map(Option.map((r) => r.value))))
        .toEqual(Option.some({ service: "echo", replica: "new", edge: "edge-1", open }))
      // Taken once: the replica handing over can no longer be named as its owner.
      expect(yield* owners.claim(conn, "old", "third")).toBe(false)
      yield* owners.remove(conn)
      expect(yield* Effect.orDie(owners.bucket.get(conn))).toEqual(Option.none())
    })))

  it.live("the host records a connection's owner before the edge hears ok, and removes it once the actor ended", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const host = yield* recordingHost({ replica: "recorder" })
      const client = yield* ActorClient.open("echo", { path: "/record", query: { a: "1" }, user: "carol" })
      const records = yield* bucket(Subjects.Bucket.connections.name, Actors.ConnectionRecord)
      const found = yield* Effect.orDie(records.get(client.conn))
      expect(Option.map(found, (r) => r.value)).toEqual(Option.some({
        service: "echo",
        replica: host.replica,
        edge: client.edge,
        open: host.actors.get(client.conn)!.conn.open
      }))
      expect(host.actors.get(client.conn)!.conn.open).toMatchObject({ path: "/record", query: { a: "1" }, claims: { sub: "carol" } })
      yield* client.close(1000, "bye")
      yield* within(client.ended)
      expect(yield* Effect.orDie(records.get(client.conn))).toEqual(Option.none())
    })))
})

describe("the connection record on the wire", () => {
  const withSchema = Schema.encodeSync(Schema.parseJson(ConnectionRecord))
  it.each<ConnectionRecord["open"]>([
    { path: "/tabs", query: {}, openedAt: 1 },
    { path: "/mcp", query: { a: "1" }, openedAt: 2, origin: "https://app.example", protocol: "mcp", transport: "http" },
    { path: "/hub", query: {}, openedAt: 3, claims: { sub: "alice", exp: 4, iat: 1, privilege: "restricted", topics: ["t"], admin: false } },
    { path: "/tabs", query: {}, openedAt: 5, stray: true, claims: { sub: "bob", stray: 1 } } as unknown as ConnectionRecord["open"]
  ])("is written by hand as its Schema writes it: %j", (open) => {
    const record = { service: "router", replica: "r-1", edge: "edge-1", open }
    expect(encodeConnectionRecord(record)).toBe(withSchema(record))
  })
})
