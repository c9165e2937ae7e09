/**
 * Graceful hand-off: a replica that stops gives each of its connections to another replica of the
 * same service, losing no frame and no answer. Every actor's subscription is a member of the
 * service's queue group, so while the old and the new owner both listen each message reaches
 * exactly one of them. For a socket, the edge holds the connection's frames meanwhile and marks
 * where the old owner's share ends, so that frames stay in order.
 *
 *  old owner                         edge                      new owner
 *  hold ──────────────────────────▶  buffers frames, marker ─▶ (old owner's mailbox pauses there)
 *  adopt (service queue group) ─────────────────────────────▶  subscribes, flushes, restores, "ok"
 *  drains its subscription; forwards what came after the marker ▶ handles those first, then the rest
 *  release ───────────────────────▶  sends the buffered frames, now to the new owner
 */
import { Host } from "@switchboard/protocol"
import * as EdgeEnvelope from "@switchboard/protocol/Envelope"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import { randomUUID } from "node:crypto"
import type { BusMessage, BusShape, Headers, Subscription } from "./Bus.ts"
import type { Envelope, Mailbox } from "./Mailbox.ts"
import * as Peer from "./Peer.ts"
import * as Subjects from "./Subjects.ts"

/** What a service's `handoff` queue group is asked: adopt a stopping replica's connection. */
export const adoptions = Peer.protocol(Host.Adoptions)
/** What one replica's inbox is asked: the rest of a handed-over mailbox, or whether it still runs. */
export const replicaInbox = Peer.protocol(Host.ReplicaInbox)

/** A forwarded message carries its envelope; the bus adapters expose headers only by name. */
const toForwarded = (m: BusMessage): Host.ForwardedMessage => ({
  headers: EdgeEnvelope.headersOf(m),
  data: Buffer.from(m.data).toString("base64"),
  ...(m.reply === undefined ? {} : { reply: m.reply })
})

/** A message forwarded by the old owner; to the actor it reads like the one it stands for. */
export class ForwardedMessage implements BusMessage {
  readonly data: Uint8Array
  readonly reply: string | undefined
  private readonly headers: Headers
  constructor(
    readonly subject: string,
    forwarded: Host.ForwardedMessage
  ) {
    this.data = Buffer.from(forwarded.data, "base64")
    this.reply = forwarded.reply
    this.headers = forwarded.headers
  }
  header(name: string) {
    const value = this.headers[name]
    return value === "" ? undefined : value
  }
}

/** What the old owner's host knows of one of its actors, for handing it over. */
export interface Handover<R> {
  readonly conn: Subjects.ConnId
  readonly edge: Subjects.EdgeId
  readonly open: Host.Adopt["open"]
  /** A Streamable HTTP session: no socket, no edge to hold; POSTs have no order between them. */
  readonly http: boolean
  readonly mailbox: Mailbox<R>
  readonly subscription: Subscription
  /** The actor's in-memory state for its successor, encoded with the service's hand-off Schema. */
  readonly state: () => Effect.Effect<unknown, HandoffFailed>
  /** Completes when the actor ends (its socket closed meanwhile, say): nothing is left to hand over. */
  readonly ended: Effect.Effect<void>
  /** Arms the marker: the mailbox pauses when the edge's marker with this token reaches it. */
  readonly expectMarker: (token: string, reached: () => void) => void
  /** Local peers stop writing into this mailbox; they publish to the subject from now on. */
  readonly disown: () => void
}

export class HandoffFailed extends Error {
  constructor(readonly reason: "NoSurvivor" | "Refused" | "Marker" | "Forward" | "State", message: string) {
    super(message)
  }
}

/**
 * How long the edge may take to mark a connection: one round trip through it, milliseconds. An
 * actor whose socket the edge no longer knows (the edge gave up on its open before the service
 * answered, and never says it closed) gets no marker at all; waiting the whole grace for it held
 * the stop for 10 s and, before the hand-offs were counted one by one, reported none handed over.
 */
const MARKER_TIMEOUT = Duration.seconds(3)

/** How often a stopping replica asks again while no other replica listens: soon, then less often. */
const noSurvivorYet = Schedule.exponential("20 millis").pipe(Schedule.union(Schedule.spaced("500 millis")))

const edgeOp = (bus: BusShape, edge: Subjects.EdgeId, conn: Subjects.ConnId, _tag: "Hold" | "Release", handoff: string) =>
  bus.unsafePublish(Subjects.edgeOut(edge), "", EdgeEnvelope.encodeEdgeOut({ _tag, conn, handoff }))

/**
 * Hands one connection to another replica. Succeeds once the new owner handles its mailbox; fails
 * with `HandoffFailed` when no replica took it (the actor then ends as it did before hand-offs,
 * its record left for adoption). Either way the edge is released.
 */
export const handOver = <R>(
  bus: BusShape,
  service: Subjects.ServiceName,
  replica: string,
  h: Handover<R>,
  timeout: Duration.DurationInput,
  /** Whether another replica is alive, so that "nobody listens" is worth asking again. */
  survivorExpected: Effect.Effect<boolean> = Effect.succeed(false)
) => {
  const token = randomUUID()
  const release = Effect.sync(() => {
    if (!h.http) edgeOp(bus, h.edge, h.conn, "Release", token)
  })
  return Effect.gen(function*() {
    // Everything the old owner must handle is before the marker (sockets) or already in its
    // mailbox (HTTP sessions); it pauses there and the rest waits.
    yield* Effect.async<void>((resume) => {
      const reached = () => resume(Effect.void)
      if (h.http) h.mailbox.pause(reached)
      else {
        h.expectMarker(token, reached)
        edgeOp(bus, h.edge, h.conn, "Hold", token)
      }
    }).pipe(
      Effect.timeoutFail({
        duration: Duration.min(Duration.decode(timeout), MARKER_TIMEOUT),
        onTimeout: () => new HandoffFailed("Marker", "the edge did not mark the connection")
      })
    )
    const state = yield* h.state()
    const request = new Host.Adopt({ conn: h.conn, edge: h.edge, open: h.open, from: replica, state }, true)
    const reply = yield* adoptions.callOn(bus, Subjects.handoff(service), request, { timeout }).pipe(
      Effect.mapError((e) =>
        e._tag === "PeerUnavailable" && e.reason === "NoResponders"
          ? new HandoffFailed("NoSurvivor", "no other replica")
          : new HandoffFailed("Refused", e._tag === "AdoptRefused" ? e.reason : e.message)
      ),
      // Nobody listening may be only for now: in a rolling restart the replica that replaces this
      // one may still be starting, or its interest not yet known across the NATS cluster. Nobody
      // got the request, so asking again is safe; the hand-off's own timeout bounds it.
      // When no other replica is alive in KV either, there is nobody to wait for (the last replica).
      Effect.retry({ while: (e) => (e.reason === "NoSurvivor" ? survivorExpected : false), schedule: noSurvivorYet }),
      Effect.timeoutFail({ duration: timeout, onTimeout: () => new HandoffFailed("NoSurvivor", `no other replica within ${Duration.format(timeout)}`) })
    )
    // The new owner listens (and the server knows): leave the queue group without dropping what
    // the server already routed here, then pass that on.
    h.disown()
    yield* h.subscription.drain
    const messages = h.mailbox.rest().filter((m): m is BusMessage => m !== "edge-lost").map(toForwarded)
    yield* replicaInbox.callOn(bus, Subjects.replicaInbox(service, reply), new Host.Forward({ conn: h.conn, messages }, true), { timeout }).pipe(
      Effect.mapError((e) => new HandoffFailed("Forward", `could not forward ${messages.length} messages: ${e.message}`))
    )
    return reply
  }).pipe(
    Effect.raceFirst(Effect.as(h.ended, undefined)),
    Effect.ensuring(release)
  )
}

export type { Envelope }

/** Hand-offs of one replica, for its metrics (`switchboard_handoffs_total{service}`). */
export interface HandoffCounts {
  /** Connections this replica handed to another as it stopped. */
  handedOver: number
  /** Connections another replica handed to this one. */
  adopted: number
  /** Connections this replica could not hand over as it stopped (left for adoption from KV). */
  failed: number
}

/** What a stopping replica's host gives the hand-off of all its actors. */
export interface Departure<R> {
  readonly bus: BusShape
  readonly service: Subjects.ServiceName
  readonly replica: string
  readonly grace: Duration.Duration
  /** Stops what reaches this replica through the service's queue groups (opens, adoptions). */
  readonly stopIntake: Effect.Effect<void>
  /** How many actors are still being built. */
  readonly starting: () => number
  /** What the service does before any actor moves (`HostOptions.beforeHandoff`). */
  readonly beforeHandoff: Effect.Effect<void> | undefined
  /** The actors this replica owns now. */
  readonly actors: () => ReadonlyArray<Handover<R>>
  /** One was handed over: it ends here without `onClosed`, and is counted. */
  readonly handedOff: (h: Handover<R>) => void
  /** Whether another replica of the service is alive, per KV. */
  readonly othersAlive: Effect.Effect<boolean>
  readonly counts: HandoffCounts
}

/** Hands every actor to the others; whatever is not handed over in time stays for adoption. */
export const handOverAll = <R>(d: Departure<R>) =>
  Effect.gen(function*() {
    yield* d.stopIntake
    // Opens that reached this replica before it left the queue group may still be starting.
    const deadline = Date.now() + Duration.toMillis(d.grace) / 2
    while (d.starting() > 0 && Date.now() < deadline) yield* Effect.sleep("5 millis")
    if (d.beforeHandoff !== undefined) yield* d.beforeHandoff
    const all = d.actors()
    if (all.length === 0) return
    // Counted as each ends: a batch cut short by the grace still says how many went over, and why
    // the others did not (a "handed 0 of 7" from a batch that timed out said neither).
    // Asked again by every hand-off that finds nobody listening: one listing serves them all a while.
    const survivorExpected = yield* Effect.cachedWithTTL(d.othersAlive, "250 millis")
    let handed = 0
    const failures = new Map<string, number>()
    const failed = (why: string) => Effect.sync(() => void failures.set(why, (failures.get(why) ?? 0) + 1))
    yield* Effect.forEach(
      all,
      (h) =>
        handOver(d.bus, d.service, d.replica, h, d.grace, survivorExpected).pipe(
          Effect.tap(() =>
            Effect.sync(() => {
              handed++
              d.handedOff(h)
            })
          ),
          Effect.catchAll((e) => Effect.zipRight(failed(e.reason), Effect.logDebug(`could not hand ${h.conn} over: ${e.message}`))),
          Effect.catchAllDefect((defect) => Effect.zipRight(failed("Defect"), Effect.logWarning("hand-off failed", defect)))
        ),
      { concurrency: 256, discard: true }
    ).pipe(
      // A finalizer runs uninterruptibly, as it must on SIGTERM, where its fiber is being
      // interrupted; only the hand-offs themselves may be cut short, by the grace period.
      Effect.interruptible,
      Effect.timeout(d.grace),
      Effect.ignore
    )
    d.counts.failed += all.length - handed
    if (handed === all.length) yield* Effect.logInfo(`handed ${handed} connections over to other replicas`)
    else {
      const unfinished = all.length - handed - [...failures.values()].reduce((a, b) => a + b, 0)
      if (unfinished > 0) failures.set("Grace", unfinished)
      const why = [...failures].map(([reason, n]) => `${reason} ${n}`).join(", ")
      // On a bus no other process shares (npm start's embedded one), no replica elsewhere will
      // adopt what is left: the connections just end with the process, as the user asked.
      yield* (d.bus.shared ? Effect.logWarning : Effect.logDebug)(
        `handed ${handed} of ${all.length} connections over (not handed: ${why}); the other ${all.length - handed} are adopted from KV once this replica's heartbeat lapses`
      )
    }
  })
