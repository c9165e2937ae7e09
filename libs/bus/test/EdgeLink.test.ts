/**
 * The link between actors and edges, on the embedded bus with the test standing where an edge
 * stands (`ActorClient`): an open is answered once the actor listens, or with the service's
 * refusal; a connection's `send` and `close` reach its socket's edge; a frame carries what the edge
 * marked on it; and `edgeLink` reaches any socket of any edge, one, many at once, or to close.
 */
import { describe, expect, it } from "@effect/vitest"
import * as ActorClient from "@switchboard/testing/ActorClient"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import { randomUUID } from "node:crypto"
import * as Actors from "../src/Actors.ts"
import { Bus, type BusMessage } from "../src/Bus.ts"
import * as Subjects from "../src/Subjects.ts"
import { eventually, onEmbeddedBus, recordingHost, within } from "./hosting.ts"

const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

/** The actor answers `echo` on its socket and closes its connection on `bye`. */
const echoing = recordingHost({
  refusePath: "/refused",
  onFrame: (actor, frame) => {
    if (frame.text === "echo") actor.conn.send(`pong:${frame.text}`, frame.traceparent)
    if (frame.text === "bye") actor.conn.close(4001, "done")
  }
})

describe("the edge link (embedded bus)", () => {
  it.live("an open is answered once the actor listens: its first frame is handled; a refusal comes back with its code and reason", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const host = yield* echoing
      expect(yield* ActorClient.refusal("echo", { path: "/refused" })).toEqual(Option.some(new ActorClient.Refused({ code: 4403, reason: "not here" })))
      const client = yield* ActorClient.open("echo", { path: "/open" })
      // Sent right after "ok", with no wait: the actor's subscription was there before the answer.
      yield* client.send("first")
      const actor = host.actors.get(client.conn)!
      yield* eventually(Effect.sync(() => actor.events.includes("frame first")))
      expect(actor.restored).toBe(false)
      expect(actor.conn.edge).toBe(client.edge)
    })))

  it.live("an open that is not a Host.Open (bad JSON, wrong types, deep nesting, a megabyte of wrong types) is logged and dropped, unanswered; the host opens the next", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const host = yield* echoing
      const bus = yield* Bus
      const headers = { [Subjects.Header.op]: "peer", [Subjects.Header.kind]: "Open" }
      const deep = `${"[".repeat(100_000)}${"]".repeat(100_000)}`
      const bodies = [
        "{not json",
        JSON.stringify({ _tag: "Open", conn: 7, edge: "e", event: { path: "/x", query: {}, openedAt: 1 } }),
        JSON.stringify({ _tag: "Open", conn: "c", edge: "e", event: deep }),
        JSON.stringify({ _tag: "Open", conn: "c".repeat(1_000_000), edge: "e", event: { path: "/x", query: { a: 1 }, openedAt: 1 } })
      ]
      for (const body of bodies) {
        const answer = yield* Effect.either(bus.request(Subjects.open("echo"), body, { headers, timeout: "200 millis" }))
        expect(Either.isLeft(answer) && answer.left._tag).toBe("RequestTimeout")
      }
      expect(host.logs.filter((l) => l.includes("malformed Open")).length).toBe(bodies.length)
      expect(host.actors.size).toBe(0)
      const client = yield* ActorClient.open("echo", { path: "/after" })
      expect(host.actors.has(client.conn)).toBe(true)
    })))

  it.live("a connection's send reaches its socket with its trace context; its close asks the edge, and the actor ends with that code", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const host = yield* echoing
      const client = yield* ActorClient.open("echo", { path: "/send" })
      yield* client.send("echo", { traceparent })
      const delivered = yield* within(client.next)
      expect(delivered).toMatchObject({ text: "pong:echo", traceparent, http: undefined, end: false })
      yield* client.send("bye")
      expect(yield* within(client.closedByService)).toEqual({ code: 4001, reason: "done" })
      // The edge closed the socket and said so: the actor's end carries the code it asked for.
      expect(yield* within(Deferred.await(host.actors.get(client.conn)!.closed))).toEqual([4001, "done"])
    })))

  it.live("a Streamable HTTP session has no socket: its close ends its actor directly", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const host = yield* recordingHost({ onFrame: (actor, frame) => (frame.text === "bye" ? actor.conn.close(4002, "gone") : undefined) })
      const edge = Subjects.EdgeId(`edge-${randomUUID()}`)
      const toEdge = yield* Queue.unbounded<string | undefined>()
      yield* (yield* Bus).subscribe(Subjects.edgeOut(edge), (m) => Queue.unsafeOffer(toEdge, m.header(Subjects.Header.op)))
      const client = yield* ActorClient.open("echo", { path: "/http", transport: "http", edge })
      yield* client.send("bye")
      expect(yield* within(Deferred.await(host.actors.get(client.conn)!.closed))).toEqual([4002, "gone"])
      yield* within(client.ended)
      // Nothing was asked of the edge, whose out subject carries what a close would have.
      expect(yield* Queue.takeAll(toEdge).pipe(Effect.map((ops) => [...ops]))).toEqual([])
    })))

  it.live("a frame carries what the edge marked on it", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const host = yield* recordingHost()
      const client = yield* ActorClient.open("echo", { path: "/marks", user: "alice" })
      yield* client.send("plain")
      yield* client.send({ marked: true }, { limited: true, traceparent, http: "ex-1", user: "bob", httpOp: "stream", lastEventId: "41" })
      const actor = host.actors.get(client.conn)!
      yield* eventually(Effect.sync(() => actor.frames.length === 2))
      const [plain, marked] = actor.frames
      expect(plain).toMatchObject({ text: "plain", limited: false, traceparent: undefined, edge: client.edge, user: "alice", http: undefined, httpOp: undefined, lastEventId: undefined })
      expect(new TextDecoder().decode(plain!.data)).toBe("plain")
      expect(marked).toMatchObject({ text: `{"marked":true}`, limited: true, traceparent, edge: client.edge, user: "bob", http: "ex-1", httpOp: "stream", lastEventId: "41" })
    })))

  it.live("edgeLink reaches one socket, many of one edge with one message, an HTTP exchange, and closes", () =>
    onEmbeddedBus(Effect.gen(function*() {
      yield* recordingHost()
      const edge = Subjects.EdgeId(`edge-${randomUUID()}`)
      const one = yield* ActorClient.open("echo", { path: "/link", edge })
      const two = yield* ActorClient.open("echo", { path: "/link", edge })
      const bus = yield* Bus
      const published = yield* Queue.unbounded<BusMessage>()
      yield* bus.subscribe(Subjects.edgeOut(edge), (m) => Queue.unsafeOffer(published, m))
      const link = yield* Actors.edgeLink

      link.toMany(edge, [one.conn, two.conn]).send("to both")
      expect((yield* within(one.next)).text).toBe("to both")
      expect((yield* within(two.next)).text).toBe("to both")
      const fanOut = yield* Queue.takeAll(published)
      expect([...fanOut].map((m) => m.header(Subjects.Header.conns))).toEqual([`${one.conn},${two.conn}`])

      link.to(edge, one.conn).send("to one", traceparent)
      link.to(edge, two.conn).send("to two")
      expect(yield* within(two.next)).toMatchObject({ text: "to two", traceparent: undefined })
      expect(yield* within(one.next)).toMatchObject({ text: "to one", traceparent })
      expect(yield* one.pending).toBe(0)

      link.exchange(edge, two.conn, "ex-7").send("event", { end: true, eventId: "7", traceparent })
      expect(yield* within(two.next)).toEqual({ text: "event", traceparent, http: "ex-7", end: true, eventId: "7" })

      link.close(edge, one.conn, 4003, "closed by link")
      expect(yield* within(one.closedByService)).toEqual({ code: 4003, reason: "closed by link" })
    })))

  it.live("closeAndEnd ends an actor whose edge is dead and would never say the socket closed", () =>
    onEmbeddedBus(Effect.gen(function*() {
      const host = yield* recordingHost()
      const bus = yield* Bus
      const dead = Subjects.EdgeId(`dead-${randomUUID()}`)
      const conn = Subjects.ConnId(randomUUID())
      const closes = yield* Queue.unbounded<BusMessage>()
      yield* bus.subscribe(Subjects.edgeOut(dead), (m) => Queue.unsafeOffer(closes, m))
      const reply = yield* Actors.requestOpen(bus, "echo", conn, dead, { path: "/dead", query: {}, openedAt: Date.now() }, "5 seconds")
      expect(reply).toBeUndefined()
      const link = yield* Actors.edgeLink
      link.closeAndEnd("echo", dead, conn, 4004, "moved")
      expect(yield* within(Deferred.await(host.actors.get(conn)!.closed))).toEqual([4004, "moved"])
      const close = yield* within(Queue.take(closes))
      expect([close.header(Subjects.Header.op), close.header(Subjects.Header.conn), close.header(Subjects.Header.code), close.header(Subjects.Header.reason)])
        .toEqual(["close", conn, "4004", "moved"])
    })))
})
