/**
 * MCPx envelopes go through the topic's history (one JetStream stream, a subject per topic) before
 * anyone receives them. An envelope the history cannot store is reported to its sender; and a
 * topic whose sequencer's process is killed loses nothing: its successor replays what was stored
 * meanwhile.
 */
import { describe, expect, it } from "@effect/vitest"
import { jetstreamManager } from "@nats-io/jetstream"
import { connect } from "@nats-io/transport-node"
import { Broker } from "@switchboard/broker"
import { Actors, Kv, Subjects } from "@switchboard/bus"
import { Edge } from "@switchboard/edge"
import { NatsServer } from "@switchboard/testing"
import * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import { type Envelope, gatewayError, join, type Participant } from "./support/Participants.ts"
import * as Processes from "./support/Processes.ts"
import { busLayer, namespace, replica, stack } from "./support/Stack.ts"

/** Removes a JetStream stream, as an operator's mistake or a lost volume would. */
const deleteStream = (servers: ReadonlyArray<string>, stream: string) =>
  Effect.promise(async () => {
    const nc = await connect({ servers: [...servers] })
    try {
      await (await jetstreamManager(nc)).streams.delete(stream)
    } finally {
      await nc.close()
    }
  })

/** Everything a participant received so far, without waiting. */
const drained = (p: Participant) =>
  Effect.map(Queue.takeAll(p.socket.messages), (texts) => Chunk.toReadonlyArray(texts).map((t) => JSON.parse(t) as Envelope))

describe("MCPx history as the topic's order", () => {
  it.scopedLive("tells the sender when its envelope cannot be stored (not_stored), after retrying, and nobody receives it", () =>
    Effect.gen(function*() {
      const { servers } = yield* NatsServer
      const ns = namespace()
      const env = { MCPX_HISTORY_RETRY: "1 second" }
      const ctx = yield* Layer.build(stack(busLayer(servers, ns), { env, services: Broker.layer }))
      const ws = (ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape).url.replace("http", "ws")
      const alice = yield* join(ws, "fragile", { id: "alice", privilege: "full" })
      const bob = yield* join(ws, "fragile", { id: "bob", privilege: "full" })
      const stored = alice.send({ kind: "chat", payload: { text: "stored" } })
      expect((yield* bob.next("chat")).id).toBe(stored.id)
      expect((yield* alice.next("chat")).id).toBe(stored.id)

      yield* deleteStream(servers, `${ns}_${Subjects.JournalName.history}`)
      const sentAt = performance.now()
      const lost = alice.send({ kind: "chat", payload: { text: "lost" } })
      expect(yield* alice.nextAny).toEqual(gatewayError("alice", "not_stored", lost.id, /could not store/))
      // Retried for MCPX_HISTORY_RETRY before it was given up.
      expect(performance.now() - sentAt).toBeGreaterThanOrEqual(900)
      // A delivery would have come within milliseconds of the send, long before the error.
      expect(yield* drained(bob)).toEqual([])
      // Its id is free again: nobody saw it, so the sender may send it anew (refused again here,
      // with the stream still gone, but not as a duplicate).
      alice.send({ id: lost.id, kind: "chat", payload: { text: "again" } })
      expect(yield* alice.nextAny).toEqual(gatewayError("alice", "not_stored", lost.id))
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 30_000)

  it.scopedLive("loses no envelope under steady traffic while the sequencer's process is killed (SIGKILL)", () =>
    Effect.gen(function*() {
      const { servers, url } = yield* NatsServer
      const ns = namespace()
      const env = { BROKER_REPLICA_HEARTBEAT: "200 millis" }
      const ctx = yield* Layer.build(stack(busLayer(servers, ns), { env }))
      const ws = (ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape).url.replace("http", "ws")
      const kv = ctx.unsafeMap.get(Kv.Kv.key) as Kv.KvShape
      const connections = Kv.typed(yield* kv.bucket(Subjects.Bucket.connections), Actors.ConnectionRecord)
      const claims = yield* kv.bucket(Subjects.Bucket.topics)

      // The first participant's replica sequences the topic: a process of its own, to be killed.
      const doomed = yield* Processes.broker({ natsUrl: url, namespace: ns, env })
      const seed = yield* join(ws, "steady", { id: "seed", privilege: "full" })
      const claim = yield* claims.get(Subjects.Key.topic("steady"))
      if (claim._tag === "None") return yield* Effect.dieMessage("the topic has no sequencer")
      const holder = new TextDecoder().decode(claim.value.value)
      yield* replica(Broker.layer, servers, ns, env)

      // Participants whose actors live in the survivor; those that landed on the doomed process
      // leave, so that only the sequencer dies with it (actor adoption is another test's subject).
      const owner = (p: Participant) =>
        connections.values().pipe(
          Effect.map((records) => records.find((r) => r.value.service === "broker" && r.value.open.claims?.sub === p.id)?.value.replica),
          Effect.orDie
        )
      const survivors: Array<Participant> = []
      for (let i = 0; survivors.length < 3 && i < 30; i++) {
        const p = yield* join(ws, "steady", { id: `p${i}`, privilege: "full" })
        if ((yield* owner(p)) === holder) yield* p.leave
        else survivors.push(p)
      }
      expect(survivors.length).toBe(3)
      yield* seed.leave
      const [alice, bob, carol] = survivors as [Participant, Participant, Participant]

      // Two senders, one envelope each every 20 ms, until told to stop; carol only listens.
      const sent: Array<string> = []
      const senders = yield* Effect.forEach([alice, bob], (p) =>
        Effect.sync(() => sent.push(p.send({ kind: "chat", payload: { text: `${p.id} ${sent.length}` } }).id)).pipe(
          Effect.repeat(Schedule.spaced("20 millis")),
          Effect.fork
        ))
      const chats = (p: Participant) => Effect.map(drained(p), (es) => es.filter((e) => e.kind === "chat").map((e) => e.id))
      const received = new Map(survivors.map((p) => [p, [] as Array<string>]))
      const receive = Effect.forEach(survivors, (p) => Effect.map(chats(p), (ids) => void received.get(p)!.push(...ids)), { discard: true })
      /** Polls what each survivor received until `done` holds for all, or fails after `seconds`. */
      const until = (done: (ids: ReadonlyArray<string>) => boolean, seconds: number, what: string) =>
        receive.pipe(
          Effect.flatMap(() => ([...received.values()].every(done) ? Effect.void : Effect.fail(new Error(what)))),
          Effect.retry(Schedule.spaced("50 millis")),
          Effect.timeoutFail({ duration: `${seconds} seconds`, onTimeout: () => new Error(`${what} within ${seconds} s`) })
        )
      yield* until((ids) => ids.length >= 20, 10, "traffic flows before the kill")

      yield* doomed.kill("SIGKILL")
      expect((yield* doomed.exited).signal).toBe("SIGKILL")
      const sentAtKill = sent.length
      // The survivor notices the lapsed replica (its liveness key expires after 6 s) and takes the
      // topic over; traffic goes on meanwhile, and then for a while after.
      const afterKill = new Set<string>()
      yield* until((ids) => {
        const fresh = sent.slice(sentAtKill)
        return fresh.length > 0 && ids.includes(fresh[0]!)
      }, 30, "the first envelope sent after the kill arrives")
      for (const id of sent.slice(sentAtKill)) afterKill.add(id)
      const resumedAt = sent.length
      yield* until((ids) => ids.includes(sent[resumedAt + 50] ?? "-"), 15, "traffic flows after the takeover")
      yield* Effect.forEach(senders, Fiber.interrupt, { discard: true })
      const all = [...sent]
      yield* until((ids) => all.every((id) => ids.includes(id)), 15, "every envelope sent arrives")

      const lost = [...received.values()].map((ids) => all.filter((id) => !ids.includes(id)).length)
      const duplicates = [...received.values()].map((ids) => ids.length - new Set(ids).size)
      console.log(
        `sent ${all.length} (${afterKill.size} while nobody sequenced), lost per receiver ${lost.join("/")}, duplicates per receiver ${duplicates.join("/")}`
      )
      expect(lost).toEqual([0, 0, 0])
      expect(afterKill.size).toBeGreaterThan(0)
      // One order for everyone.
      const firstSeen = (ids: ReadonlyArray<string>) => [...new Set(ids)]
      expect(firstSeen(received.get(bob)!)).toEqual(firstSeen(received.get(alice)!))
      expect(firstSeen(received.get(carol)!)).toEqual(firstSeen(received.get(alice)!))
    }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)), 90_000)
})
