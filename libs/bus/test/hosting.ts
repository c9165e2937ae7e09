/**
 * A host of the `echo` service whose actors record what happens to them, for the unit tests of
 * the host's pieces on the embedded bus: which connections were made (and whether restored), the
 * frames each handled, in order, and how each ended.
 */
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Logger from "effect/Logger"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import type * as Duration from "effect/Duration"
import type * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import * as Actors from "../src/Actors.ts"
import type { Bus } from "../src/Bus.ts"
import type { Journal } from "../src/Journal.ts"
import type { Kv } from "../src/Kv.ts"
import * as MemoryBus from "../src/MemoryBus.ts"
import type * as Subjects from "../src/Subjects.ts"

export interface RecordingActor {
  readonly conn: Actors.Connection
  readonly restored: boolean
  /** What happened to it, in order: `frame <text>`, `closed <code> <reason>`, `scope closed`. */
  readonly events: Array<string>
  /** Every frame it handled, as it got it. */
  readonly frames: Array<Actors.Frame>
  readonly closed: Deferred.Deferred<readonly [number, string]>
  /** Its scope closed, for whatever reason (also when its replica stops without `onClosed`). */
  readonly scopeClosed: Deferred.Deferred<void>
}

export interface RecordingOptions {
  readonly replica?: string
  readonly replicaHeartbeat?: Duration.DurationInput
  readonly edgeCheckInterval?: Duration.DurationInput
  /** What a frame does besides being recorded; an Effect holds the mailbox until it completes. */
  readonly onFrame?: (actor: RecordingActor, frame: Actors.Frame) => Effect.Effect<void> | void
  /** Refuse connections whose path is this. */
  readonly refusePath?: string
  /** Refuse connections adopted from a replica that is gone, as an actor whose state died with it does. */
  readonly refuseRestored?: boolean
}

/** Hosts `echo` until the scope closes; hand-off is off, so a stop leaves connections to adoption. */
export const recordingHost = (options: RecordingOptions = {}) =>
  Effect.gen(function*() {
    const replica = options.replica ?? randomUUID()
    const made = yield* Queue.unbounded<RecordingActor>()
    const actors = new Map<Subjects.ConnId, RecordingActor>()
    const logs: Array<string> = []
    const { replica: id } = yield* Actors.host({
      service: "echo",
      replica,
      handoff: false,
      edgeCheckInterval: options.edgeCheckInterval ?? "1 hour",
      ...(options.replicaHeartbeat === undefined ? {} : { replicaHeartbeat: options.replicaHeartbeat }),
      make: (conn, restored) =>
        Effect.gen(function*() {
          if (conn.open.path === options.refusePath) return yield* Effect.fail(new Actors.Refuse(4403, "not here"))
          if (restored && options.refuseRestored) return yield* Effect.fail(new Actors.Refuse(1012, "connect again"))
          const actor: RecordingActor = {
            conn,
            restored,
            events: [],
            frames: [],
            closed: yield* Deferred.make<readonly [number, string]>(),
            scopeClosed: yield* Deferred.make<void>()
          }
          yield* Effect.addFinalizer(() =>
            Effect.sync(() => {
              actor.events.push("scope closed")
              Deferred.unsafeDone(actor.scopeClosed, Effect.void)
            })
          )
          actors.set(conn.id, actor)
          Queue.unsafeOffer(made, actor)
          return {
            onFrame: (frame) => {
              actor.events.push(`frame ${frame.text}`)
              actor.frames.push(frame)
              return options.onFrame?.(actor, frame)
            },
            onClosed: (code, reason) =>
              Effect.sync(() => {
                actor.events.push(`closed ${code} ${reason}`)
                Deferred.unsafeDone(actor.closed, Effect.succeed([code, reason] as const))
              })
          } satisfies Actors.Actor
        })
    }).pipe(Effect.provide(Logger.replace(Logger.defaultLogger, Logger.make(({ message }) => void logs.push(Array.isArray(message) ? message.map(String).join(" ") : String(message))))))
    return { replica: id, made, actors, logs }
  })

/** Fails the test rather than hanging it. */
export const within = <A, E, R>(effect: Effect.Effect<A, E, R>, duration: Duration.DurationInput = "5 seconds") =>
  Effect.timeoutFail(effect, { duration, onTimeout: () => new Error(`not within ${String(duration)}`) })

/** Polls `check` until it holds, for what no event announces (a log line, a KV record). */
export const eventually = (check: Effect.Effect<boolean>, duration: Duration.DurationInput = "5 seconds") =>
  within(
    Effect.flatMap(check, (ok) => (ok ? Effect.void : Effect.fail("not yet"))).pipe(
      Effect.retry({ while: (e) => e === "not yet", schedule: Schedule.spaced("10 millis") })
    ),
    duration
  )

/** Runs a test on a fresh embedded bus and KV, which outlive everything the test's scope opened. */
export const onEmbeddedBus = <A, E>(test: Effect.Effect<A, E, Bus | Kv | Journal | Scope.Scope>) =>
  Effect.provide(Effect.scoped(test), MemoryBus.layer)
