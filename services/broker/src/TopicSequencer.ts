/**
 * The sequencer of one topic: it follows the topic's history, whose order is the topic's total
 * order, and fans each envelope out with one publish per edge that has members; joins and leaves
 * reach it on the topic's subject, and it welcomes members and tells the others. One instance per
 * topic holds the state its phases share. What it does in the phases when it is not the topic's
 * plain owner belongs to other roles, which it is given (`Sequencing`): giving the topic up once
 * idle (`TopicRelease.ts`) and handing it between replicas (`TopicTransfer.ts`).
 */
import { SpanKind, type Tracer } from "@opentelemetry/api"
import { type Actors, type Bus, type Journal, type Peer, Subjects } from "@switchboard/bus"
import { Edge, Mcpx } from "@switchboard/protocol"
import { Telemetry } from "@switchboard/telemetry"
import * as Deferred from "effect/Deferred"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import type * as Fiber from "effect/Fiber"
import * as FiberId from "effect/FiberId"
import * as Option from "effect/Option"
import type * as Scope from "effect/Scope"
import { gateway } from "./Participant.ts"
import type { Transfer } from "./TopicTransfer.ts"

/**
 * An owner sequences; a `releasing` one has given up its claim after the topic stayed empty and
 * holds what arrives until it wins the claim back; a `handing-on` one passes what arrives to the
 * new owner. When a replica stops, its sequencer is `transferring` the topic to one that is
 * `receiving` it.
 */
export type Phase = "owner" | "releasing" | "handing-on" | "transferring" | "receiving"

/** What a replica gives each of its sequencers. */
export interface Sequencing {
  /** The part of `Actors.edgeLink` a sequencer uses. */
  readonly link: {
    readonly to: (edge: Subjects.EdgeId, conn: Subjects.ConnId) => Actors.Socket
    readonly toMany: (edge: Subjects.EdgeId, conns: ReadonlyArray<Subjects.ConnId>) => Actors.Socket
    readonly close: (edge: Subjects.EdgeId, conn: Subjects.ConnId, code: number, reason: string) => void
  }
  readonly tracer: Option.Option<Tracer>
  readonly maxParticipants: number
  readonly topicIdle: Duration.DurationInput
  /** Runs work started outside any Effect (bus callbacks, timers) until the broker stops. */
  readonly run: <A, E>(effect: Effect.Effect<A, E>) => Fiber.RuntimeFiber<A, E>
  readonly toTopic: (topic: string, event: Peer.Tell<Mcpx.TopicEvent>, traceparent?: string) => void
  /** A message on the topic's subject, typed; `undefined` when it does not decode (logged). */
  readonly decode: (message: Bus.BusMessage) => Mcpx.TopicEvent | undefined
  /** Records the last sequence sent out, where a successor starts. */
  readonly record: (topic: string, seq: number) => Effect.Effect<void, Bus.BusError>
  /** The topic has been empty for `topicIdle`: give it up. */
  readonly release: (topic: TopicSequencer) => Effect.Effect<void>
  /** Something arrived after the claim was given up: win it back, or hand it on. */
  readonly reclaim: (topic: TopicSequencer) => Effect.Effect<void>
}

export interface Start {
  readonly members?: ReadonlyArray<Mcpx.Member>
  /** The last history sequence sent out (by a predecessor, if any). */
  readonly delivered: number
  readonly phase: Phase
  readonly transfer?: Transfer
}

export class TopicSequencer {
  /** Members by participant id, in join order. */
  readonly members: Map<string, Mcpx.Member>
  /** The last history sequence sent out, and the last one recorded in KV. */
  delivered: number
  recorded: number
  /** One handle per edge with members, rebuilt only when membership changes. */
  private everyone: ReadonlyArray<Actors.Socket> | undefined = undefined
  phase: Phase
  transfer: Transfer | undefined
  /** Runs out when the topic has been empty for MCPX_TOPIC_IDLE. */
  private idle: Fiber.RuntimeFiber<void> | undefined = undefined
  /** Done when a release ends, either way; joins on this replica wait for it. */
  released: Deferred.Deferred<void> | undefined = undefined
  /** What arrived while not the owner: on the topic's subject, and in its history. */
  readonly held: Array<Bus.BusMessage> = []
  readonly heldEntries: Array<Journal.JournalEntry> = []
  reclaiming = false

  constructor(
    private readonly sequencing: Sequencing,
    readonly name: string,
    /** The topic's bus subscription; closing it lets go of the topic. */
    readonly subscription: Scope.CloseableScope,
    start: Start
  ) {
    this.members = new Map((start.members ?? []).map((m) => [m.participant, m]))
    this.delivered = this.recorded = start.delivered
    this.phase = start.phase
    this.transfer = start.transfer
  }

  /** What the topic's subscription does with a message, by the sequencer's phase. A field: handed on unbound. */
  readonly onMessage = (message: Bus.BusMessage): void => {
    if (this.phase === "owner") return this.onOwnMessage(message)
    if (this.phase === "handing-on") return this.handOn(message)
    if (this.transfer !== undefined) return this.transfer.onMessage(this, message)
    this.held.push(message)
    this.reclaimOnce()
  }

  /** What the sequencer does with a history entry, by its phase. A field: handed on unbound. */
  readonly onEntry = (entry: Journal.JournalEntry): void => {
    if (this.phase === "owner") return this.deliver(entry)
    // Handing on: the new owner replays from the sequence recorded when this one let go.
    if (this.phase === "handing-on") return
    this.heldEntries.push(entry)
    if (this.phase === "releasing") this.reclaimOnce()
  }

  private reclaimOnce() {
    if (!this.reclaiming) this.sequencing.run(this.sequencing.reclaim(this))
  }

  /** A message on the topic's subject, typed (see `Sequencing.decode`). */
  event(message: Bus.BusMessage): Mcpx.TopicEvent | undefined {
    return this.sequencing.decode(message)
  }

  private onOwnMessage(message: Bus.BusMessage) {
    const event = this.event(message)
    if (event?._tag === "TopicJoin" || event?._tag === "TopicLeave") this.onEvent(event)
  }

  /** A join or a leave, in the order the topic's subject brought it. */
  onEvent(event: Mcpx.TopicJoin | Mcpx.TopicLeave): void {
    if (event._tag === "TopicJoin") return this.join(event.member)
    const m = this.members.get(event.participant)
    if (m === undefined || m.conn !== event.conn) return // a replaced socket leaving
    this.members.delete(m.participant)
    this.everyone = undefined
    this.fanOut(gateway("presence", { event: "leave", participant: { id: m.participant, privilege: m.privilege } }))
    this.idleWhenEmpty()
  }

  private join(m: Mcpx.Member) {
    const { link, maxParticipants } = this.sequencing
    this.stopIdle()
    const previous = this.members.get(m.participant)
    // The same socket again: an adopted actor, or a changed privilege. No welcome, no presence.
    if (previous?.conn === m.conn) return this.setMember(m)
    if (previous === undefined && this.members.size >= maxParticipants) {
      return link.close(Subjects.EdgeId(m.edge), Subjects.ConnId(m.conn), Edge.CloseCode.PolicyViolation, "topic is full")
    }
    this.setMember(m)
    const participant = { id: m.participant, privilege: m.privilege }
    const participants = [...this.members.values()].map((p) => ({ id: p.participant, privilege: p.privilege }))
    link.to(Subjects.EdgeId(m.edge), Subjects.ConnId(m.conn)).send(
      gateway("system", { event: "welcome", participant, participants, protocol: Mcpx.PROTOCOL }, { to: [m.participant] })
    )
    // A participant replacing its own older socket is one presence, not a leave and a join.
    if (previous === undefined) this.fanOut(gateway("presence", { event: "join", participant }), m.participant)
  }

  private setMember(m: Mcpx.Member) {
    this.members.set(m.participant, m)
    this.everyone = undefined
  }

  /** One handle per edge that has members (but `except`): each send is one publish per edge. */
  private byEdge(except?: string): ReadonlyArray<Actors.Socket> {
    const conns = new Map<string, Array<Subjects.ConnId>>()
    for (const m of this.members.values()) {
      if (m.participant === except) continue
      const group = conns.get(m.edge)
      if (group) group.push(Subjects.ConnId(m.conn))
      else conns.set(m.edge, [Subjects.ConnId(m.conn)])
    }
    return [...conns].map(([edge, group]) => this.sequencing.link.toMany(Subjects.EdgeId(edge), group))
  }

  /** Sends one frame to every member (but `except`). */
  private fanOut(data: string | Uint8Array, except?: string, traceparent?: string) {
    const sockets = except === undefined ? (this.everyone ??= this.byEdge()) : this.byEdge(except)
    for (const s of sockets) s.send(data, traceparent)
  }

  /** An envelope stored in the topic's history goes out to every member, the sender included. */
  deliver(entry: Journal.JournalEntry): void {
    const { tracer } = this.sequencing
    const traced = Option.isSome(tracer)
      ? Telemetry.startSpan(tracer.value, "broker.fanout", entry.traceparent, {
        kind: SpanKind.PRODUCER,
        attributes: { "mcpx.topic": this.name, "mcpx.members": this.members.size, "mcpx.seq": entry.seq }
      })
      : undefined
    this.fanOut(entry.data, undefined, traced?.traceparent)
    this.delivered = entry.seq
    traced?.span.end()
  }

  /** Once the topic is empty, an owner gives it up after MCPX_TOPIC_IDLE unless someone joins. */
  idleWhenEmpty(): void {
    if (this.members.size > 0 || this.idle !== undefined || this.phase !== "owner") return
    const { release, run, topicIdle } = this.sequencing
    this.idle = run(Effect.zipRight(Effect.sleep(topicIdle), Effect.suspend(() => {
      this.idle = undefined
      return release(this)
    })))
  }

  stopIdle(): void {
    if (this.idle === undefined) return
    this.idle.unsafeInterruptAsFork(FiberId.none)
    this.idle = undefined
  }

  /** Passes a message on to the topic's new owner, as it came. */
  handOn(message: Bus.BusMessage): void {
    const event = this.event(message)
    if (event !== undefined) this.sequencing.toTopic(this.name, event, message.header(Subjects.Header.traceparent))
  }

  releaseEnded(): void {
    if (this.released !== undefined) Deferred.unsafeDone(this.released, Exit.void)
    this.released = undefined
  }

  /** The topic is this replica's again: what was held is handled in the order it came. */
  readonly resume: Effect.Effect<void> = Effect.sync(() => {
    this.phase = "owner"
    this.transfer = undefined
    this.reclaiming = false
    for (const m of this.held.splice(0)) this.onOwnMessage(m)
    for (const e of this.heldEntries.splice(0)) this.deliver(e)
    this.releaseEnded()
    this.idleWhenEmpty()
  })

  /** Resumes from outside any Effect (a bus callback). */
  resumeSoon(): void {
    this.sequencing.run(this.resume)
  }

  /** Records the last sequence sent out, when it moved since the last record. */
  readonly recordDelivered: Effect.Effect<void, Bus.BusError> = Effect.suspend(() => {
    const seq = this.delivered
    if (seq <= this.recorded) return Effect.void
    return Effect.map(this.sequencing.record(this.name, seq), () => {
      this.recorded = Math.max(this.recorded, seq)
    })
  })
}
