/**
 * Liveness of an actor host on the embedded bus and KV: a replica whose heartbeat key lapses has
 * its connections adopted by a survivor (restored, the record naming the survivor, frames reaching
 * it); one whose key lapsed but still answers keeps them; connections whose edge's key is gone end
 * as a lost socket does, except Streamable HTTP sessions, which outlive any edge.
 */
import { describe, expect, it } from "@effect/vitest"
import * as ActorClient from "@switchboard/testing/ActorClient"
import * as Cause from "effect/Cause"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import * as Actors from "../src/Actors.ts"
import { Bus } from "../src/Bus.ts"
import { Kv, typed } from "../src/Kv.ts"
import * as Subjects from "../src/Subjects.ts"
import { eventually, onEmbeddedBus, recordingHost, within } from "./hosting.ts"

const records = Effect.flatMap(Kv, (kv) => Effect.map(Effect.orDie(kv.bucket(Subjects.Bucket.connections)), (b) => typed(b, Actors.ConnectionRecord)))
const holder = (conn: Subjects.ConnId) =>
  Effect.flatMap(records, (b) => b.get(conn).pipe(Effect.orDie, Effect.map(Option.map((r) => r.value.replica))))

describe("liveness (embedded bus)", () => {
  it.live("a heartbeat too slow for the replica key's lifetime is refused at start", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const exit = yield* Effect.exit(recordingHost({ replicaHeartbeat: "4 seconds" }))
      expect(Exit.isFailure(exit) ? Cause.pretty(exit.cause) : "started").toMatch(/a replica heartbeat of 4s is too slow/)
    })))

  it.live("a replica whose heartbeat lapses has its connections adopted by a survivor, restored", () =>
    onEmbeddedBus(Effect.gen(function*() {
      // The first replica, alone, takes the connection; it stops without handing it over.
      const firstScope = yield* Scope.make()
      const first = yield* Scope.extend(recordingHost({ replica: "first" }), firstScope)
      const client = yield* ActorClient.open("echo", { path: "/adopt" })
      const original = first.actors.get(client.conn)!
      expect(yield* holder(client.conn)).toEqual(Option.some("first"))

      const survivor = yield* recordingHost({ replica: "survivor", replicaHeartbeat: "50 millis" })
      yield* Scope.close(firstScope, Exit.void)
      // Stopped, not closed: its state stays for the adopter, and its client is not told anything.
      yield* within(Deferred.await(original.scopeClosed))
      expect(original.events).not.toContain("closed 1000 ")

      const adopted = yield* within(Queue.take(survivor.made))
      expect(adopted.conn.id).toBe(client.conn)
      expect(adopted.restored).toBe(true)
      expect(adopted.conn.open.path).toBe("/adopt")
      expect(yield* holder(client.conn)).toEqual(Option.some("survivor"))
      expect(survivor.logs).toContain("adopted 1 connections from replicas that are gone")
      // The adopter subscribed to the connection: the edge's frames reach it now.
      yield* client.send("after adoption")
      yield* eventually(Effect.sync(() => adopted.events.includes("frame after adoption")))
      // And it is the one that ends with the socket (before the survivor stops with the test).
      yield* client.close(1000, "done")
      yield* within(client.ended)
      expect(adopted.events).toContain("closed 1000 done")
    })))

  it.live("a connection adopted from a replica that is gone, and refused, is closed with the refusal and its record dropped", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const firstScope = yield* Scope.make()
      yield* Scope.extend(recordingHost({ replica: "first" }), firstScope)
      const client = yield* ActorClient.open("echo", { path: "/refused-on-adoption" })
      const survivor = yield* recordingHost({ replica: "survivor", replicaHeartbeat: "50 millis", refuseRestored: true })
      yield* Scope.close(firstScope, Exit.void)
      // Nobody awaits the adopter's answer, so the adopter itself tells the edge.
      expect(yield* within(client.closedByService)).toEqual({ code: 1012, reason: "connect again" })
      yield* eventually(Effect.map(holder(client.conn), Option.isNone).pipe(Effect.provideService(Kv, yield* Kv)))
      expect(survivor.logs).toContain("refused the adopted connection: 1012 connect again")
      expect(survivor.actors.size).toBe(0)
    })))

  it.live("a replica whose key lapsed but still answers keeps its connections", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const first = yield* recordingHost({ replica: "slow-beat", replicaHeartbeat: "2500 millis" })
      const client = yield* ActorClient.open("echo", { path: "/keep" })
      const survivor = yield* recordingHost({ replica: "watcher", replicaHeartbeat: "50 millis" })
      // Its key lapses as when its KV writes fail for a while (a leader election), though it runs.
      const replicas = yield* Effect.orDie((yield* Kv).bucket(Subjects.Bucket.replicas))
      yield* Effect.orDie(replicas.delete(Subjects.Key.replica("echo", "slow-beat")))
      yield* eventually(Effect.sync(() => survivor.logs.some((l) => l.includes("slow-beat lapsed in KV but still answer"))))
      expect(yield* holder(client.conn)).toEqual(Option.some("slow-beat"))
      expect(yield* Queue.size(survivor.made)).toBe(0)
      yield* client.send("still here")
      yield* eventually(Effect.sync(() => first.actors.get(client.conn)!.events.includes("frame still here")))
    })))

  it.live("an edge lost ends its socket connections with 1006; a live edge's and HTTP sessions stay", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const host = yield* recordingHost({ edgeCheckInterval: "20 millis" })
      const bus = yield* Bus
      // No heartbeat key for this edge: it died without a word.
      const dead = Subjects.EdgeId(`dead-${randomUUID()}`)
      const open = (conn: Subjects.ConnId, transport?: "http") =>
        Actors.requestOpen(bus, "echo", conn, dead, { path: "/lost", query: {}, openedAt: Date.now(), ...(transport ? { transport } : {}) }, "5 seconds")
      const session = Subjects.ConnId(randomUUID())
      yield* open(session, "http")
      // The ActorClient beats for its edge, as a live edge does.
      const alive = yield* ActorClient.open("echo", { path: "/alive" })
      const socket = Subjects.ConnId(randomUUID())
      yield* open(socket)

      expect(yield* within(Deferred.await(host.actors.get(socket)!.closed))).toEqual([1006, "edge lost"])
      expect(host.logs.some((l) => l.includes(`edge ${dead} is gone; closing its 1 connections`))).toBe(true)
      // The check that found the socket's edge gone also looked at these, and left them.
      expect(yield* Deferred.poll(host.actors.get(session)!.closed)).toEqual(Option.none())
      expect(yield* Deferred.poll(host.actors.get(alive.conn)!.closed)).toEqual(Option.none())
    })))
})
