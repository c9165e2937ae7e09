/**
 * The hand-off of all actors as a replica stops, on the embedded bus, through the host's own
 * interface: what an actor keeps in memory travels as its service's Schema encodes it and arrives
 * decoded; a state that does not decode at the adopter (another version's Schema) is refused with
 * a log line, and the connection is not taken; a connection that ended is not handed over.
 * Streamable HTTP sessions, which need no edge to hold their frames, stand for every connection.
 */
import { describe, expect, it } from "@effect/vitest"
import { Host } from "@switchboard/protocol"
import * as ActorClient from "@switchboard/testing/ActorClient"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as Logger from "effect/Logger"
import * as Queue from "effect/Queue"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import * as Actors from "../src/Actors.ts"
import { Bus } from "../src/Bus.ts"
import * as Handoff from "../src/Handoff.ts"
import * as Subjects from "../src/Subjects.ts"
import { eventually, onEmbeddedBus, within } from "./hosting.ts"

/**
 * What the test actors keep in memory: how many frames they handled, and since when. Neither
 * travels as it is in memory (a number as a string, a Date as an ISO string): a state sent
 * unencoded, or taken undecoded, would show.
 */
const Counted = Schema.Struct({ frames: Schema.NumberFromString, since: Schema.DateFromString })
/** The same state as another version of the service reads it: `frames` a plain number. */
const CountedElsewhere = Schema.Struct({ frames: Schema.Number, since: Schema.DateFromString })

interface Made<S> {
  readonly conn: Actors.Connection
  readonly restored: boolean
  readonly handedOver: S | undefined
  readonly frames: Array<string>
}

const SINCE = new Date("2026-01-02T03:04:05.000Z")

/** A replica of `echo` whose actors count frames and hand the count over with `state`. */
const countingHost = <S, I>(replica: string, state: Schema.Schema<S, I>, keep: (frames: number) => S, replicaHeartbeat: Duration.DurationInput = "2 seconds") =>
  Effect.gen(function*() {
    const made = yield* Queue.unbounded<Made<S>>()
    const actors = new Map<Subjects.ConnId, Made<S>>()
    const logs: Array<string> = []
    const host = yield* Actors.host({
      service: "echo",
      replica,
      handoff: { state },
      shutdownGrace: "3 seconds",
      replicaHeartbeat,
      make: (conn, restored, handedOver) =>
        Effect.sync(() => {
          const actor: Made<S> = { conn, restored, handedOver, frames: [] }
          actors.set(conn.id, actor)
          Queue.unsafeOffer(made, actor)
          return {
            onFrame: (frame) => void actor.frames.push(frame.text),
            onHandoff: () => keep(actor.frames.length)
          } satisfies Actors.Actor<never, never, S>
        })
    }).pipe(Effect.provide(Logger.replace(Logger.defaultLogger, Logger.make(({ message }) => void logs.push(Array.isArray(message) ? message.map(String).join(" ") : String(message))))))
    return { ...host, made, actors, logs }
  })

describe("the hand-off of all actors (embedded bus)", () => {
  it.live("a stopping replica hands its sessions over with their state, encoded and decoded with the service's Schema; one that ended stays behind", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const firstScope = yield* Scope.make()
      const first = yield* Scope.extend(countingHost("first", Counted, (frames) => ({ frames, since: SINCE })), firstScope)
      const moving = yield* ActorClient.open("echo", { path: "/moving", transport: "http" })
      const ending = yield* ActorClient.open("echo", { path: "/ending", transport: "http" })
      yield* moving.send("one")
      yield* moving.send("two")
      yield* eventually(Effect.sync(() => first.actors.get(moving.conn)?.frames.length === 2))
      yield* ending.close(1000, "done")
      yield* within(ending.ended)

      const second = yield* countingHost("second", Counted, (frames) => ({ frames, since: SINCE }))
      yield* Scope.close(firstScope, Exit.void)
      const adopted = yield* within(Queue.take(second.made))
      expect(adopted.conn.id).toBe(moving.conn)
      expect(adopted.restored).toBe(true)
      // Decoded there: the Date came back a Date, not the string it travelled as.
      expect(adopted.handedOver).toEqual({ frames: 2, since: SINCE })
      expect(adopted.handedOver?.since).toBeInstanceOf(Date)
      // The session that ended was forgotten with its end: nothing of it was handed over.
      expect(first.handoffs).toEqual({ handedOver: 1, adopted: 0, failed: 0 })
      expect(second.handoffs.adopted).toBe(1)
      expect(yield* Queue.size(second.made)).toBe(0)
      expect(first.logs).toContain("handed 1 connections over to other replicas")
      yield* moving.send("three")
      yield* eventually(Effect.sync(() => adopted.frames.includes("three")))
      yield* moving.close(1000, "done")
      yield* within(moving.ended)
    })))

  it.live("a hand-off state that does not match the adopter's Schema is refused with a log line; the connection is adopted from KV instead", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const firstScope = yield* Scope.make()
      const first = yield* Scope.extend(countingHost("old-version", Counted, (frames) => ({ frames, since: SINCE })), firstScope)
      const client = yield* ActorClient.open("echo", { path: "/skewed", transport: "http" })
      yield* client.send("one")
      yield* eventually(Effect.sync(() => first.actors.get(client.conn)?.frames.length === 1))

      const second = yield* countingHost("new-version", CountedElsewhere, (frames) => ({ frames, since: SINCE }), "50 millis")
      yield* Scope.close(firstScope, Exit.void)
      expect(first.handoffs).toEqual({ handedOver: 0, adopted: 0, failed: 1 })
      expect(second.handoffs.adopted).toBe(0)
      expect(second.logs.some((l) => l.startsWith(`refused to adopt ${client.conn}: its hand-off state does not match this service's Schema`))).toBe(true)
      // As after a crash: the survivor adopts it from KV once the stopped replica's key is gone, with no state.
      const adopted = yield* within(Queue.take(second.made))
      expect(adopted).toMatchObject({ restored: true, handedOver: undefined })
      expect(adopted.conn.id).toBe(client.conn)
      yield* client.close(1000, "done")
      yield* within(client.ended)
    })))

  it.live("an Adopt whose state does not decode is answered AdoptRefused, before any actor is made", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const host = yield* countingHost("adopter", Counted, (frames) => ({ frames, since: SINCE }))
      const conn = randomUUID()
      const adopt = new Host.Adopt({ conn, edge: "e", open: { path: "/x", query: {}, openedAt: 1, transport: "http" }, from: "gone", state: { frames: 1, since: SINCE.toISOString() } }, true)
      const answer = yield* Effect.either(Handoff.adoptions.callOn(yield* Bus, Subjects.handoff("echo"), adopt, { timeout: "5 seconds" }))
      expect(Either.isLeft(answer) && answer.left._tag === "AdoptRefused" ? answer.left.reason : answer).toBe("the hand-off state does not match this service's Schema")
      expect(host.logs.some((l) => l.startsWith(`refused to adopt ${conn}`))).toBe(true)
      expect(yield* Queue.size(host.made)).toBe(0)
    })))
})
