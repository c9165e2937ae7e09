/**
 * An actor's mailbox: one message at a time, in arrival order, whether its handler finishes at
 * once or returns an Effect; what a handler itself causes waits its turn; a hand-off pauses it and
 * takes the rest. Through the host on the embedded bus: a connection's frames keep their order,
 * and its end (`onClosed`, then its scope) comes after the frames sent before the close.
 */
import { describe, expect, it } from "@effect/vitest"
import * as ActorClient from "@switchboard/testing/ActorClient"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as FiberSet from "effect/FiberSet"
import type { BusMessage } from "../src/Bus.ts"
import { type Envelope, Mailbox } from "../src/Mailbox.ts"
import { eventually, onEmbeddedBus, recordingHost, within } from "./hosting.ts"

/** A message known by its subject; the mailbox never looks inside. */
const message = (label: string): BusMessage => ({ subject: label, data: new Uint8Array(), reply: undefined, header: () => undefined })
const label = (m: Envelope) => (m === "edge-lost" ? m : m.subject)

const mailbox = Effect.map(FiberSet.makeRuntime<never>(), (fork) => new Mailbox<never>(fork))

describe("Mailbox", () => {
  it.scopedLive("handles what arrived before it started, then the rest, in arrival order", () =>
    Effect.gen(function*() {
      const box = yield* mailbox
      const handled: Array<string> = []
      box.offer(message("a"))
      box.offer(message("b"))
      expect(handled).toEqual([])
      box.start((m) => void handled.push(label(m)))
      box.offer(message("c"))
      box.offer("edge-lost")
      // Synchronous handlers run where the message arrives: no fiber, nothing to wait for.
      expect(handled).toEqual(["a", "b", "c", "edge-lost"])
    }))

  it.scopedLive("a handler's Effect holds the next message until it completes", () =>
    Effect.gen(function*() {
      const box = yield* mailbox
      const gate = yield* Deferred.make<void>()
      const handled: Array<string> = []
      const last = yield* Deferred.make<void>()
      box.start((m) => {
        handled.push(label(m))
        if (label(m) === "slow") return Effect.zipRight(Deferred.await(gate), Effect.sync(() => void handled.push("slow done")))
        if (label(m) === "last") Deferred.unsafeDone(last, Effect.void)
      })
      box.offer(message("slow"))
      box.offer(message("next"))
      box.offer(message("last"))
      expect(handled).toEqual(["slow"])
      yield* Deferred.succeed(gate, undefined)
      yield* within(Deferred.await(last))
      expect(handled).toEqual(["slow", "slow done", "next", "last"])
    }))

  it.scopedLive("a message offered while one is handled waits its turn instead of running inside it", () =>
    Effect.gen(function*() {
      const box = yield* mailbox
      const handled: Array<string> = []
      box.start((m) => {
        handled.push(label(m))
        if (label(m) === "a") {
          box.offer(message("b"))
          handled.push("a end")
        }
      })
      box.offer(message("a"))
      expect(handled).toEqual(["a", "a end", "b"])
    }))

  it.scopedLive("once stopped, handles nothing more, even after the handler in flight completes", () =>
    Effect.gen(function*() {
      const box = yield* mailbox
      const gate = yield* Deferred.make<void>()
      const finished = yield* Deferred.make<void>()
      const handled: Array<string> = []
      box.start((m) => {
        handled.push(label(m))
        if (label(m) === "slow") return Effect.ensuring(Deferred.await(gate), Deferred.succeed(finished, undefined))
      })
      box.offer(message("slow"))
      box.offer(message("queued"))
      box.stop()
      yield* Deferred.succeed(gate, undefined)
      yield* within(Deferred.await(finished))
      // The in-flight handler's end must not wake a stopped mailbox.
      yield* Effect.yieldNow()
      box.offer(message("late"))
      expect(handled).toEqual(["slow"])
    }))

  it.scopedLive("a pause stops after the message in hand; the rest, prepended to another mailbox, comes first there", () =>
    Effect.gen(function*() {
      const old = yield* mailbox
      const gate = yield* Deferred.make<void>()
      const paused = yield* Deferred.make<void>()
      const handledOld: Array<string> = []
      old.start((m) => {
        handledOld.push(label(m))
        if (label(m) === "a") return Deferred.await(gate)
      })
      old.offer(message("a"))
      old.offer(message("b"))
      old.offer(message("c"))
      old.pause(() => Deferred.unsafeDone(paused, Effect.void))
      yield* Deferred.succeed(gate, undefined)
      yield* within(Deferred.await(paused))
      expect(handledOld).toEqual(["a"])
      const rest = old.rest()
      expect(rest.map(label)).toEqual(["b", "c"])

      // The adopter already got "d" on its own subscription; what the old owner forwards is older.
      const adopter = yield* mailbox
      const handledNew: Array<string> = []
      adopter.offer(message("d"))
      adopter.prepend(rest)
      adopter.start((m) => void handledNew.push(label(m)))
      expect(handledNew).toEqual(["b", "c", "d"])
    }))
})

describe("a connection's mailbox in the host (embedded bus)", () => {
  it.live("frames are handled one at a time in the order sent, though one of them takes a while", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      const host = yield* recordingHost({
        onFrame: (actor, frame) => {
          if (frame.text === "slow") return Effect.zipRight(Deferred.await(gate), Effect.sync(() => void actor.events.push("slow done")))
        }
      })
      const client = yield* ActorClient.open("echo", { path: "/order" })
      const actor = host.actors.get(client.conn)!
      for (const text of ["slow", "1", "2", "3"]) yield* client.send(text)
      yield* eventually(Effect.sync(() => actor.events.length > 0))
      expect(actor.events).toEqual(["frame slow"])
      yield* Deferred.succeed(gate, undefined)
      yield* eventually(Effect.sync(() => actor.events.length === 5))
      expect(actor.events).toEqual(["frame slow", "slow done", "frame 1", "frame 2", "frame 3"])
    })))

  it.live("an actor ends after the frames sent before its close: onClosed, then its scope, then its record", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      const host = yield* recordingHost({
        onFrame: (actor, frame) => {
          if (frame.text === "slow") return Effect.zipRight(Deferred.await(gate), Effect.sync(() => void actor.events.push("slow done")))
        }
      })
      const client = yield* ActorClient.open("echo", { path: "/end" })
      const actor = host.actors.get(client.conn)!
      yield* client.send("slow")
      yield* client.close(4000, "bye")
      yield* eventually(Effect.sync(() => actor.events.length > 0))
      yield* Deferred.succeed(gate, undefined)
      expect(yield* within(Deferred.await(actor.closed))).toEqual([4000, "bye"])
      yield* within(client.ended)
      expect(actor.events).toEqual(["frame slow", "slow done", "closed 4000 bye", "scope closed"])
    })))
})
