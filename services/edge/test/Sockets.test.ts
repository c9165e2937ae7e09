/**
 * The socket I/O alone, over real WebSockets and the embedded bus, with the service's side played
 * on the bus by hand (the open reply, the connection's subject, deliveries to this edge): frames
 * reach the actor in order, wait while the session starts or moves, and come out after the
 * hand-off's marker; deliveries, closes and refusals reach the client.
 */
import { describe, expect, it } from "@effect/vitest"
import { Actors, Bus, MemoryBus, Subjects } from "@switchboard/bus"
import { Host } from "@switchboard/protocol"
import { Telemetry } from "@switchboard/telemetry"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Queue from "effect/Queue"
import { type Server, WebSocketServer } from "ws"
import * as Boundary from "../src/Boundary.ts"
import { EdgeWebSocket } from "../src/EdgeSocket.ts"
import { EdgeMetrics } from "../src/Metrics.ts"
import { socketTarget } from "../src/Requests.ts"
import type { Route } from "../src/Routes.ts"
import * as Outbound from "../src/Outbound.ts"
import * as Sockets from "../src/Sockets.ts"
import { Turn } from "../src/Turn.ts"
import { closedWith, connect, eventually } from "./support.ts"

const edgeId = Subjects.EdgeId("edge-unit")
const route: Route = { service: "echo", auth: "in-band", traceInbound: false }
const env = Telemetry.disabled

/** What the service's side of a connection sees on its subject, in order. */
interface Seen {
  readonly op: string
  readonly conn: string
  readonly text: string
  readonly header: (name: string) => string | undefined
}

/**
 * The socket I/O behind a plain ws server, and a stand-in for the service on the bus: it answers
 * `open` (after `gate`, when given), taking the connection unless told to `refuse`, and records
 * what arrives for its connections.
 */
const setup = (
  options: { readonly refuse?: Host.OpenRefused; readonly gate?: Deferred.Deferred<void>; readonly noService?: boolean; readonly die?: boolean } = {}
) =>
  Effect.gen(function*() {
    // A bus of its own for the test's scope, so that two in one test hear only their own.
    const bus = Context.get(yield* Layer.build(MemoryBus.layer), Bus.Bus)
    const metrics = new EdgeMetrics()
    const seen = yield* Queue.unbounded<Seen>()
    const opens = yield* Queue.unbounded<string>()
    yield* bus.subscribe(`${route.service}.conn.*`, (m) =>
      void Queue.unsafeOffer(seen, {
        op: m.header(Subjects.Header.op) ?? "",
        conn: m.header(Subjects.Header.conn) ?? "",
        text: Bus.text(m),
        header: (name: string) => m.header(name)
      }))
    if (options.noService !== true) {
      yield* Actors.opens.serve(Subjects.open(route.service), (request, replyTo) => {
        Queue.unsafeOffer(opens, request.conn)
        const reply = options.die === true
          ? replyTo(request).complete(Exit.die(new Error("the service's open died")))
          : options.refuse === undefined
          ? replyTo(request).succeed(undefined)
          : replyTo(request).fail(options.refuse)
        return options.gate === undefined ? reply : Effect.zipRight(Deferred.await(options.gate), reply)
      }).pipe(Effect.provideService(Bus.Bus, bus))
    }
    const sockets = yield* Sockets.make({
      edgeId,
      boundary: yield* Boundary.make,
      turn: new Turn(),
      metrics,
      limitOf: () => 1024,
      outboundHighWaterMark: 1024 * 1024,
      rate: 1000,
      burst: 1000,
      openTimeout: "2 seconds",
      closeGrace: "1 second",
      pingInterval: "30 seconds"
    }).pipe(Effect.provideService(Bus.Bus, bus))
    yield* Outbound.subscribe({ edgeId, sockets: sockets.outbound, http: undefined, logCaught: () => {} }).pipe(Effect.provideService(Bus.Bus, bus))
    const wss = yield* Effect.acquireRelease(
      Effect.async<Server<typeof EdgeWebSocket>>((resume) => {
        const wss = new WebSocketServer<typeof EdgeWebSocket>({ port: 0, host: "127.0.0.1", WebSocket: EdgeWebSocket }, () => resume(Effect.succeed(wss)))
      }),
      (wss) =>
        Effect.async<void>((resume) => {
          for (const ws of wss.clients) ws.terminate()
          wss.close(() => resume(Effect.void))
        })
    )
    wss.on("connection", (ws, req) => sockets.open(req, req.socket, ws, socketTarget(new URL(req.url ?? "/", "http://edge")), route, undefined))
    const address = wss.address()
    const url = `ws://127.0.0.1:${typeof address === "object" && address !== null ? address.port : 0}/echo`
    /** Puts a message on this edge's outbound subject, as a service does. */
    const out = (headers: Bus.Headers, data = "") => bus.publish(Subjects.edgeOut(edgeId), data, headers)
    /**
     * A message of the test's own on the connection's subject: once it arrives, everything the
     * edge published there before it has arrived too, so what came before it is all there is.
     */
    const probe = (conn: string) => bus.publish(Subjects.conn(route.service, Subjects.ConnId(conn)), "probe", { [Subjects.Header.op]: "probe" })
    return { sockets, metrics, seen, opens, url, out, probe }
  })

const take = <A>(q: Queue.Queue<A>) => Queue.take(q).pipe(Effect.timeoutFail({ duration: "5 seconds", onTimeout: () => new Error("nothing arrived in 5 s") }), Effect.orDie)
const takeN = <A>(q: Queue.Queue<A>, n: number) => Effect.forEach(Array.from({ length: n }), () => take(q))

describe("the edge's socket I/O", () => {
  it.scopedLive("relays frames in order to the connection's subject, and deliveries back to one socket or many", () =>
    Effect.gen(function*() {
      const io = yield* setup()
      const a = yield* connect(io.url)
      const conn = yield* take(io.opens)
      for (const n of [1, 2, 3]) a.send(`frame ${n}`)
      const frames = yield* takeN(io.seen, 3)
      expect(frames.map((f) => [f.op, f.conn, f.text])).toEqual([1, 2, 3].map((n) => ["frame", conn, `frame ${n}`]))
      expect(frames[0]?.header(Subjects.Header.edge)).toBe(edgeId)
      yield* io.out({ [Subjects.Header.op]: "deliver", [Subjects.Header.conn]: conn }, "to a")
      expect(yield* a.nextText).toBe("to a")
      const b = yield* connect(io.url)
      const other = yield* take(io.opens)
      yield* io.out({ [Subjects.Header.op]: "deliver", [Subjects.Header.conns]: `${conn},${other}` }, "to both")
      expect([yield* a.nextText, yield* b.nextText]).toEqual(["to both", "to both"])
      expect(io.sockets.size()).toBe(2)
    }).pipe(Effect.provide(env)))

  it.scopedLive("keeps frames that arrive before the service takes the connection, and sends them in order once it does", () =>
    Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      const io = yield* setup({ gate })
      const a = yield* connect(io.url)
      const conn = yield* take(io.opens)
      for (const n of [1, 2, 3]) a.send(`early ${n}`)
      yield* eventually(Effect.filterOrFail(Effect.sync(() => io.metrics.framesIn), (n) => n === 3))
      yield* io.probe(conn)
      expect((yield* take(io.seen)).op).toBe("probe")
      yield* Deferred.succeed(gate, undefined)
      expect((yield* takeN(io.seen, 3)).map((f) => f.text)).toEqual(["early 1", "early 2", "early 3"])
    }).pipe(Effect.provide(env)))

  it.scopedLive("holds a moving connection's frames behind the hand-off's marker, and releases them in order to its token only", () =>
    Effect.gen(function*() {
      const io = yield* setup()
      const a = yield* connect(io.url)
      const conn = yield* take(io.opens)
      a.send("before 1")
      a.send("before 2")
      yield* takeN(io.seen, 2)
      yield* io.out({ [Subjects.Header.op]: "hold", [Subjects.Header.conn]: conn, [Subjects.Header.handoff]: "move-1" })
      const marker = yield* take(io.seen)
      expect([marker.op, marker.header(Subjects.Header.handoff)]).toEqual(["marker", "move-1"])
      a.send("during 1")
      a.send("during 2")
      yield* eventually(Effect.filterOrFail(Effect.sync(() => io.metrics.framesIn), (n) => n === 4))
      // A release for another hand-off lets nothing go. The edge handles its outbound messages in
      // order, so once the client has the delivery sent after it, the release has been handled.
      yield* io.out({ [Subjects.Header.op]: "release", [Subjects.Header.conn]: conn, [Subjects.Header.handoff]: "move-0" })
      yield* io.out({ [Subjects.Header.op]: "deliver", [Subjects.Header.conn]: conn }, "handled")
      expect(yield* a.nextText).toBe("handled")
      yield* io.probe(conn)
      expect((yield* take(io.seen)).op).toBe("probe")
      yield* io.out({ [Subjects.Header.op]: "release", [Subjects.Header.conn]: conn, [Subjects.Header.handoff]: "move-1" })
      expect((yield* takeN(io.seen, 2)).map((f) => [f.op, f.text])).toEqual([["frame", "during 1"], ["frame", "during 2"]])
      a.send("after")
      expect((yield* take(io.seen)).text).toBe("after")
    }).pipe(Effect.provide(env)))

  it.scopedLive("tells the actor of a close that happened while held only once the hold is released", () =>
    Effect.gen(function*() {
      const io = yield* setup()
      const a = yield* connect(io.url)
      const conn = yield* take(io.opens)
      yield* io.out({ [Subjects.Header.op]: "hold", [Subjects.Header.conn]: conn, [Subjects.Header.handoff]: "move-1" })
      expect((yield* take(io.seen)).op).toBe("marker")
      a.send("last words")
      yield* eventually(Effect.filterOrFail(Effect.sync(() => io.metrics.framesIn), (n) => n === 1))
      a.ws.close(4000, "leaving")
      yield* eventually(Effect.filterOrFail(Effect.sync(() => io.sockets.size()), (n) => n === 0))
      yield* io.probe(conn)
      expect((yield* take(io.seen)).op).toBe("probe")
      yield* io.out({ [Subjects.Header.op]: "release", [Subjects.Header.conn]: conn, [Subjects.Header.handoff]: "move-1" })
      const [frame, closed] = yield* takeN(io.seen, 2)
      expect([frame?.op, frame?.text]).toEqual(["frame", "last words"])
      expect([closed?.op, closed?.header(Subjects.Header.code), closed?.header(Subjects.Header.reason)]).toEqual(["closed", "4000", "leaving"])
    }).pipe(Effect.provide(env)))

  it.scopedLive("closes as the service asks, and tells the actor the code it closed with", () =>
    Effect.gen(function*() {
      const io = yield* setup()
      const a = yield* connect(io.url)
      const conn = yield* take(io.opens)
      yield* io.out({ [Subjects.Header.op]: "close", [Subjects.Header.conn]: conn, [Subjects.Header.code]: "4001", [Subjects.Header.reason]: "x".repeat(200) })
      const close = yield* closedWith(a)
      // A reason longer than a close frame holds is cut to 120 bytes and an ellipsis.
      expect([close.code, close.reason]).toEqual([4001, `${"x".repeat(120)}...`])
      const told = yield* take(io.seen)
      expect([told.op, told.header(Subjects.Header.code)]).toEqual(["closed", "4001"])
    }).pipe(Effect.provide(env)))

  it.scopedLive("closes 1003 on a binary frame, and with the service's refusal or 1013 when no service takes the socket", () =>
    Effect.gen(function*() {
      const io = yield* setup()
      const a = yield* connect(io.url)
      yield* take(io.opens)
      a.ws.send(Buffer.from([1, 2, 3]), { binary: true })
      expect(yield* closedWith(a)).toEqual({ code: 1003, reason: "binary frames are not supported; send text" })

      const refused = yield* setup({ refuse: new Host.OpenRefused({ code: 4403, reason: "not for you" }) })
      expect(yield* closedWith(yield* connect(refused.url))).toEqual({ code: 4403, reason: "not for you" })

      const nobody = yield* setup({ noService: true })
      expect(yield* closedWith(yield* connect(nobody.url))).toEqual({ code: 1013, reason: "echo service unavailable" })
    }).pipe(Effect.provide(env)))

  it.scopedLive("closes 1011 a socket whose service answers its open with a defect, and tells the service it closed", () =>
    Effect.gen(function*() {
      const io = yield* setup({ die: true })
      const a = yield* connect(io.url)
      const conn = yield* take(io.opens)
      expect(yield* closedWith(a)).toEqual({ code: 1011, reason: "could not start the session" })
      const told = yield* take(io.seen)
      expect([told.op, told.conn, told.header(Subjects.Header.code)]).toEqual(["closed", conn, "1011"])
    }).pipe(Effect.provide(env)))

  it.scopedLive("tells the service a socket it answered too late for is closed, at the timeout and again at the late answer, so no late actor outlives it", () =>
    Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      const io = yield* setup({ gate })
      const a = yield* connect(io.url)
      const conn = yield* take(io.opens)
      // The open times out at the edge (2 s here) before the service answers it.
      expect(yield* closedWith(a)).toEqual({ code: 1013, reason: "echo service did not answer" })
      const told = yield* take(io.seen)
      expect([told.op, told.conn, told.header(Subjects.Header.code)]).toEqual(["closed", conn, "1013"])
      // The late answer (an actor the service made after all) is told again, now that it listens.
      yield* Deferred.succeed(gate, undefined)
      const again = yield* take(io.seen)
      expect([again.op, again.conn, again.header(Subjects.Header.code)]).toEqual(["closed", conn, "1013"])
      yield* io.probe(conn)
      expect((yield* take(io.seen)).op).toBe("probe")
    }).pipe(Effect.provide(env)))

  it.scopedLive("closes every socket with 1001 on shutdown", () =>
    Effect.gen(function*() {
      const io = yield* setup()
      const a = yield* connect(io.url)
      const b = yield* connect(io.url)
      yield* takeN(io.opens, 2)
      yield* io.sockets.closeAll("shutting down", 1001, "server shutting down")
      expect([yield* closedWith(a), yield* closedWith(b)]).toEqual([1, 2].map(() => ({ code: 1001, reason: "server shutting down" })))
      expect(io.sockets.size()).toBe(0)
    }).pipe(Effect.provide(env)))

  it("cuts a long close reason on whole characters", () => {
    expect(Sockets.fitCloseReason("short")).toBe("short")
    const cut = Sockets.fitCloseReason("é".repeat(100))
    expect(Buffer.byteLength(cut)).toBeLessThanOrEqual(123)
    expect(cut).toBe(`${"é".repeat(60)}...`)
  })
})
