/**
 * Typed peer messages between actors, on both bus adapters: between two actors of one host the
 * value is handed over as it is, synchronously; between two hosts (two bus connections on NATS) it
 * is encoded, decoded on receipt, and a message that does not decode is logged and dropped. An ask
 * gets its typed answer, its typed failure, or a timeout.
 */
import { describe, expect, layer } from "@effect/vitest"
import { NatsServer } from "@switchboard/testing"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Cause from "effect/Cause"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import * as Actors from "../src/Actors.ts"
import { Bus, type BusShape } from "../src/Bus.ts"
import type { Journal } from "../src/Journal.ts"
import type { Kv } from "../src/Kv.ts"
import * as MemoryBus from "../src/MemoryBus.ts"
import * as NatsBus from "../src/NatsBus.ts"
import * as Peer from "../src/Peer.ts"
import * as Subjects from "../src/Subjects.ts"

class Note extends Schema.TaggedClass<Note>()("Note", { text: Schema.String }) {}
class Refused extends Schema.TaggedError<Refused>()("Refused", { why: Schema.String }) {}
class Double extends Schema.TaggedRequest<Double>()("Double", { success: Schema.Number, failure: Refused, payload: { n: Schema.Number } }) {}
/** Never answered: what an ask's timeout is for. */
class Silent extends Schema.TaggedRequest<Silent>()("Silent", { success: Schema.Void, failure: Schema.Never, payload: {} }) {}
/** A tagged struct: what a protocol uses for a message sent once per request. */
const Ping = Schema.TaggedStruct("Ping", { n: Schema.Number })
type Ping = typeof Ping.Type
type TestPeer = Note | Ping | Double | Silent
const peers = Peer.protocol(Schema.Union(Note, Ping, Double, Silent))

/** The bus and KV of each of two hosts. */
type TwoHosts<R> = Effect.Effect<readonly [Context.Context<Bus | Kv | Journal>, Context.Context<Bus | Kv | Journal>], unknown, R | Scope.Scope>

interface TestActor {
  readonly conn: Actors.Connection
  /** What `receive` got, as it got it, appended synchronously. */
  readonly received: Array<Note>
  readonly notes: Queue.Queue<Note>
  readonly pings: Queue.Queue<Ping>
  /** Where the asker of a `Double` of 1000 waits: that one is left for another replica to answer. */
  readonly kept: Queue.Queue<string | undefined>
}

const openEvent = { path: "/peer", query: {}, openedAt: 0 }

/** A host of the `echo` service whose actors answer `Double` and keep every `Note`. */
const hostOn = (ctx: Context.Context<Bus | Kv | Journal>, logs: Array<string>) =>
  Effect.gen(function*() {
    const replica = randomUUID()
    const made = new Map<Subjects.ConnId, Deferred.Deferred<TestActor>>()
    yield* Actors.host({
      service: "echo",
      replica,
      protocol: peers,
      handoff: false,
      edgeCheckInterval: "1 hour",
      make: (conn) =>
        Effect.gen(function*() {
          const received: Array<Note> = []
          const notes = yield* Queue.unbounded<Note>()
          const pings = yield* Queue.unbounded<Ping>()
          const kept = yield* Queue.unbounded<string | undefined>()
          const receive = (message: TestPeer, reply: Peer.ReplyTo): Effect.Effect<void> | void => {
            switch (message._tag) {
              case "Ping":
                return void Queue.unsafeOffer(pings, message)
              case "Note":
                received.push(message)
                return void Queue.unsafeOffer(notes, message)
              case "Double":
                if (message.n === 1000) return void Queue.unsafeOffer(kept, reply(message).subject)
                return message.n < 0 ? reply(message).fail(new Refused({ why: `${message.n} is negative` })) : reply(message).succeed(message.n * 2)
              case "Silent":
                return
            }
          }
          const actor = { conn, received, notes, pings, kept }
          const waiting = made.get(conn.id)
          if (waiting !== undefined) Deferred.unsafeDone(waiting, Effect.succeed(actor))
          return { onFrame: () => undefined, receive } satisfies Actors.Actor<never, TestPeer>
        })
    }).pipe(
      Effect.provide(ctx),
      Effect.provide(Logger.replace(Logger.defaultLogger, Logger.make(({ message }) => void logs.push(Array.isArray(message) ? message.map(String).join(" ") : String(message)))))
    )
    const bus = Context.get(ctx, Bus)
    /** Opens connections until one lands on this host (the service's queue group picks a host). */
    const open = Effect.gen(function*() {
      for (let attempt = 0; attempt < 64; attempt++) {
        const id = Subjects.ConnId(randomUUID())
        const here = yield* Deferred.make<TestActor>()
        made.set(id, here)
        const reply = yield* Actors.requestOpen(bus, "echo", id, Subjects.EdgeId("edge-peer"), openEvent, "5 seconds")
        expect(reply).toBeUndefined()
        const done = yield* Deferred.poll(here)
        made.delete(id)
        if (done._tag === "Some") return yield* done.value
      }
      return yield* Effect.dieMessage("no connection landed on this host in 64 opens")
    })
    return { open, bus }
  })

const deadline = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.timeoutFail(effect, { duration: "10 seconds", onTimeout: () => new Error("not within 10 s") })

const suite = <R, E>(name: string, shared: Layer.Layer<R, E>, twoHosts: TwoHosts<R>) =>
  describe(`${name}: typed peer messages`, () => {
    layer(shared, { timeout: "60 seconds", excludeTestServices: true })((it) => {
      const setup = Effect.gen(function*() {
        const [first, second] = yield* twoHosts
        const logs: Array<string> = []
        const a = yield* hostOn(first, logs)
        const b = yield* hostOn(second, logs)
        return { a, b, logs }
      })

      it.scoped("in-process, tell hands the value itself over synchronously, and ask answers typed", () =>
        Effect.gen(function*() {
          const { a } = yield* setup
          const one = yield* a.open
          const two = yield* a.open
          const note = new Note({ text: "hello" })
          peers.tell(one.conn, two.conn.id, note)
          // Handled before `tell` returned, and not a copy: nothing was encoded or decoded.
          expect(two.received).toHaveLength(1)
          expect(two.received[0]).toBe(note)
          expect(yield* peers.ask(one.conn, two.conn.id, new Double({ n: 21 }))).toBe(42)
          const refused = yield* Effect.flip(peers.ask(one.conn, two.conn.id, new Double({ n: -1 })))
          expect(refused).toBeInstanceOf(Refused)
          expect(refused).toMatchObject({ why: "-1 is negative" })
          const silent = yield* Effect.flip(peers.ask(one.conn, two.conn.id, new Silent(), { timeout: "100 millis" }))
          expect(silent).toBeInstanceOf(Peer.PeerTimeout)
        }))

      it.scoped("between two hosts, messages are encoded and arrive decoded, in order; asks answer typed", () =>
        Effect.gen(function*() {
          const { a, b } = yield* setup
          const there = yield* a.open
          const here = yield* b.open
          const first = new Note({ text: "first" })
          peers.tell(here.conn, there.conn.id, first)
          peers.tell(here.conn, there.conn.id, new Note({ text: "second" }))
          const got = yield* deadline(Effect.all([Queue.take(there.notes), Queue.take(there.notes)]))
          expect(got.map((n) => n.text)).toEqual(["first", "second"])
          // Decoded into the class, not handed over: this one crossed the bus.
          expect(got[0]).toBeInstanceOf(Note)
          expect(got[0]).not.toBe(first)
          peers.tell(here.conn, there.conn.id, { _tag: "Ping", n: 7 })
          expect(yield* deadline(Queue.take(there.pings))).toEqual({ _tag: "Ping", n: 7 })
          expect(yield* deadline(peers.ask(here.conn, there.conn.id, new Double({ n: 5 })))).toBe(10)
          const refused = yield* Effect.flip(peers.ask(here.conn, there.conn.id, new Double({ n: -3 })))
          expect(refused).toBeInstanceOf(Refused)
          expect(refused).toMatchObject({ _tag: "Refused", why: "-3 is negative" })
          const silent = yield* Effect.flip(peers.ask(here.conn, there.conn.id, new Silent(), { timeout: "200 millis" }))
          expect(silent).toBeInstanceOf(Peer.PeerTimeout)
          // Nobody listens for a connection that has no actor.
          const nobody = yield* Effect.flip(peers.ask(here.conn, Subjects.ConnId(randomUUID()), new Double({ n: 1 })))
          expect(nobody).toMatchObject({ _tag: "PeerUnavailable", reason: "NoResponders" })
        }))

      it.scoped("a request taken over the bus can be answered from elsewhere by its reply subject, as after a hand-off", () =>
        Effect.gen(function*() {
          const { a, b } = yield* setup
          const there = yield* a.open
          const here = yield* b.open
          const keptSubject = Effect.flatMap(deadline(Queue.take(there.kept)), (subject) =>
            subject === undefined ? Effect.dieMessage("an ask over the bus came with no reply subject") : Effect.succeed(subject))
          const asked = yield* Effect.fork(peers.ask(here.conn, there.conn.id, new Double({ n: 1000 })))
          // Another replica (the adopter) rebuilds the reply from the subject alone.
          yield* peers.replyAt(b.bus, Double, yield* keptSubject).succeed(2000)
          expect(yield* deadline(Fiber.join(asked))).toBe(2000)
          const refused = yield* Effect.fork(Effect.flip(peers.ask(here.conn, there.conn.id, new Double({ n: 1000 }))))
          yield* peers.replyAt(b.bus, Double, yield* keptSubject).fail(new Refused({ why: "answered elsewhere" }))
          const failure = yield* deadline(Fiber.join(refused))
          expect(failure).toBeInstanceOf(Refused)
          expect(failure).toMatchObject({ why: "answered elsewhere" })
        }))

      it.scoped("a message that does not decode is logged and dropped; the actor goes on", () =>
        Effect.gen(function*() {
          const { a, b, logs } = yield* setup
          const there = yield* a.open
          const raw: BusShape = b.bus
          const subject = Subjects.conn("echo", there.conn.id)
          const headers = (kind: string) => ({ [Subjects.Header.op]: "peer", [Subjects.Header.kind]: kind })
          raw.unsafePublish(subject, JSON.stringify({ _tag: "Note", text: 42 }), headers("Note"))
          raw.unsafePublish(subject, "not json", headers("Note"))
          raw.unsafePublish(subject, JSON.stringify({ _tag: "Unheard" }), headers("Unheard"))
          peers.tell(Peer.outside(b.bus, "echo"), there.conn.id, new Note({ text: "after" }))
          // In order on one subject: the bad ones were handled, and dropped, before this one.
          expect((yield* deadline(Queue.take(there.notes))).text).toBe("after")
          expect(there.received.map((n) => n.text)).toEqual(["after"])
          expect(logs.filter((l) => l.startsWith("peer: dropped a message"))).toHaveLength(3)
          expect(logs.some((l) => l.includes("malformed Note"))).toBe(true)
          expect(logs.some((l) => l.includes("unknown peer message kind \"Unheard\""))).toBe(true)
        }))

      it.scoped("a service endpoint serves asks with call, typed both ways", () =>
        Effect.gen(function*() {
          const { a, b } = yield* setup
          const subject = `peer.${randomUUID()}`
          yield* peers.serve(subject, (message, reply) => (message._tag === "Double" ? reply(message).succeed(message.n + 1) : undefined)).pipe(
            Effect.provideService(Bus, a.bus)
          )
          // The server knows the subscription before the other connection asks.
          yield* a.bus.flush
          expect(yield* deadline(peers.call(subject, new Double({ n: 1 })).pipe(Effect.provideService(Bus, b.bus)))).toBe(2)
        }))

      it.scoped("unsafeCallOn answers with a callback, once: typed success, typed failure, nobody listens, no answer in time", () =>
        Effect.gen(function*() {
          const { a, b } = yield* setup
          const subject = `peer.${randomUUID()}`
          yield* peers.serve(subject, (message, reply) => {
            if (message._tag !== "Double") return
            return message.n < 0 ? reply(message).fail(new Refused({ why: "negative" })) : reply(message).succeed(message.n + 1)
          }).pipe(Effect.provideService(Bus, a.bus))
          yield* a.bus.flush
          const call = <Req extends Double | Silent>(to: string, request: Req, timeout: Duration.DurationInput) =>
            Effect.gen(function*() {
              const exits = yield* Queue.unbounded<Exit.Exit<Peer.Success<Req>, Peer.Failure<Req> | Peer.PeerTimeout | Peer.PeerUnavailable>>()
              peers.unsafeCallOn(b.bus, to, request, { timeout }, (exit) => Queue.unsafeOffer(exits, exit))
              return yield* deadline(Queue.take(exits))
            })
          expect(yield* call(subject, new Double({ n: 1 }), "5 seconds")).toEqual(Exit.succeed(2))
          const refused = yield* call(subject, new Double({ n: -1 }), "5 seconds")
          expect(Exit.isFailure(refused) && Cause.failureOption(refused.cause).pipe(Option.map((e) => e._tag), Option.getOrNull)).toBe("Refused")
          const nobody = yield* call(`peer.${randomUUID()}`, new Double({ n: 1 }), "5 seconds")
          expect(Exit.isFailure(nobody) && Cause.failureOption(nobody.cause).pipe(Option.map((e) => e._tag === "PeerUnavailable" && e.reason), Option.getOrNull)).toBe("NoResponders")
          // The server ignores Silent: no answer.
          const silent = yield* call(subject, new Silent(), "200 millis")
          expect(Exit.isFailure(silent) && Cause.failureOption(silent.cause).pipe(Option.map((e) => e._tag), Option.getOrNull)).toBe("PeerTimeout")
        }))
    })
  })

let counter = 0
const namespace = () => `peer${process.pid}x${counter++}`

// Two hosts in one process share its one in-memory bus.
suite("embedded", Layer.empty, Effect.map(Layer.build(MemoryBus.layer), (ctx) => [ctx, ctx] as const))

// Two hosts are two NATS connections, as two replicas are.
suite(
  "nats",
  NatsServer.layer,
  Effect.gen(function*() {
    const { servers } = yield* NatsServer
    const ns = namespace()
    const connect = Layer.build(NatsBus.layer({ servers, namespace: ns }))
    return [yield* connect, yield* connect] as const
  })
)
