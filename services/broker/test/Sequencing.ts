/**
 * One topic's sequencer alone, with no bus and no sockets: tests stand where the topic's subject,
 * its history, the edges and the sequencer's other roles stand (`Sequencing`), and see what it
 * sends to which sockets.
 */
import { type Actors, type Bus, Peer, Subjects } from "@switchboard/bus"
import { Mcpx } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Fiber from "effect/Fiber"
import * as FiberSet from "effect/FiberSet"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Scope from "effect/Scope"
import * as TestClock from "effect/TestClock"
import { type Phase, type Sequencing, TopicSequencer } from "../src/TopicSequencer.ts"
import type { Transfer } from "../src/TopicTransfer.ts"

const topicEvents = Peer.protocol(Mcpx.TopicEvent)
const encoder = new TextEncoder()
const decoder = new TextDecoder()

/** A frame as a socket got it: `edge/conn[,conn…]` and the envelope. */
interface Sent {
  readonly to: string
  readonly envelope: { readonly kind: string; readonly to?: ReadonlyArray<string>; readonly payload: Record<string, unknown> }
}

export const member = (participant: string, edge: string, conn: string): Mcpx.Member => ({
  topic: "room",
  participant,
  privilege: "full",
  conn,
  edge,
  joinedAt: 0
})

export const joined = (m: Mcpx.Member) => new Mcpx.TopicJoin({ member: m })
export const left = (m: Mcpx.Member) => new Mcpx.TopicLeave({ participant: m.participant, conn: m.conn })

/** A topic event as it comes on the topic's subject. */
export const onSubject = (event: Peer.Tell<Mcpx.TopicEvent>): Bus.BusMessage => ({
  subject: Subjects.topic("room"),
  data: encoder.encode(topicEvents.encode(event)),
  reply: undefined,
  header: (name) => (name === Subjects.Header.kind ? event._tag : undefined)
})

export const entry = (seq: number, text = `e${seq}`) => ({ seq, data: encoder.encode(JSON.stringify({ kind: "chat", payload: { text } })), at: 0 })

/**
 * A sequencer of topic `room` in `phase`, with what it sends, closes, records, publishes on the
 * topic's subject, and asks of its release role, kept for the test to read.
 */
export const sequencer = (
  options: {
    readonly phase?: Phase
    readonly delivered?: number
    readonly maxParticipants?: number
    readonly transfer?: Transfer
    /** The release role to give it, instead of queues that say what it asked. */
    readonly roles?: Pick<Sequencing, "release" | "reclaim">
  } = {}
) =>
  Effect.gen(function*() {
    const sent: Array<Sent> = []
    const closed: Array<string> = []
    const recorded: Array<number> = []
    const published: Array<Mcpx.TopicEvent> = []
    const released = yield* Queue.unbounded<number>()
    const reclaims = yield* Queue.unbounded<TopicSequencer>()
    const socket = (to: string): Actors.Socket => ({
      send: (data) => void sent.push({ to, envelope: JSON.parse(typeof data === "string" ? data : decoder.decode(data)) })
    })
    const runFork = yield* FiberSet.runtime(yield* FiberSet.make())<never>()
    const forks: Array<Fiber.RuntimeFiber<unknown, unknown>> = []
    const run: Sequencing["run"] = (effect) => {
      const fiber = runFork(effect)
      forks.push(fiber)
      return fiber
    }
    /** Until the work the sequencer started since the last look is done (not for idle timers: they sleep). */
    const settled = Effect.suspend(() => Effect.forEach(forks.splice(0), Fiber.await, { discard: true }))
    const sequencing: Sequencing = {
      link: {
        to: (edge, conn) => socket(`${edge}/${conn}`),
        toMany: (edge, conns) => socket(`${edge}/${conns.join(",")}`),
        close: (edge, conn, code, reason) => void closed.push(`${edge}/${conn} ${code} ${reason}`)
      },
      tracer: Option.none(),
      maxParticipants: options.maxParticipants ?? 100,
      topicIdle: "1 minute",
      run,
      toTopic: (_topic, event) => void published.push(event),
      decode: (message) => Either.getOrUndefined(topicEvents.decode(message)),
      record: (_topic, seq) => Effect.sync(() => void recorded.push(seq)),
      release: () => Effect.flatMap(TestClock.currentTimeMillis, (now) => Queue.offer(released, now)),
      reclaim: (topic) =>
        Effect.suspend(() => {
          topic.reclaiming = true
          return Queue.offer(reclaims, topic)
        }),
      ...options.roles
    }
    const subscription = yield* Scope.make()
    const topic = new TopicSequencer(sequencing, "room", subscription, {
      delivered: options.delivered ?? 0,
      phase: options.phase ?? "owner",
      ...(options.transfer === undefined ? {} : { transfer: options.transfer })
    })
    /** What was sent since the last look. */
    const take = () => sent.splice(0)
    return { topic, take, settled, closed, recorded, published, released, reclaims }
  })

/** Until the sequencer's idle timer sleeps on the test clock. */
export const untilIdleTimer: Effect.Effect<void> = Effect.flatMap(TestClock.sleeps(), (sleeps) => (sleeps.length > 0 ? Effect.void : Effect.zipRight(Effect.yieldNow(), untilIdleTimer)))

export const alice = member("alice", "e1", "c1")
export const bob = member("bob", "e1", "c2")
export const carol = member("carol", "e2", "c3")
