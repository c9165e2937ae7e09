/**
 * Admission to a topic: who may open a participant's socket, in which topic and with which
 * privilege, before its actor (`Participant.ts`) checks what it sends. An admitted participant's
 * topic has a sequencer before its join is published, its membership is in KV, and an older
 * socket of the same participant is closed: the last one wins.
 */
import { ActorResource, Actors, Subjects } from "@switchboard/bus"
import { type Auth, Edge, Mcpx } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import { Participant, type Room } from "./Participant.ts"
import type { Replica } from "./Replica.ts"
import type { Sequencers } from "./Sequencers.ts"

const CloseCode = Edge.CloseCode

const refuse = (reason: string) => Either.left(new Actors.Refuse(CloseCode.PolicyViolation, reason))

/** The topic a socket asks for and the participant its token names, or why it may not join. */
export const admit = (open: Edge.OpenEvent): Either.Either<{ readonly topic: string; readonly token: Auth.Claims }, Actors.Refuse> => {
  const topic = open.query["topic"]
  if (topic === undefined || topic === "") return refuse("topic is required (?topic=)")
  if (topic.length > Mcpx.MAX_TOPIC_LENGTH) return refuse(`topic names are limited to ${Mcpx.MAX_TOPIC_LENGTH} characters`)
  const token = open.claims
  if (token === undefined) return refuse("authentication required")
  // Whoever joins as `system:…` would speak with the gateway's voice.
  if (Mcpx.isReserved(token.sub)) return refuse(`participant ids starting with ${Mcpx.RESERVED_PREFIX} are reserved for the gateway`)
  if (token.sub.length > Mcpx.MAX_ID_LENGTH) return refuse(`participant ids are limited to ${Mcpx.MAX_ID_LENGTH} characters`)
  if (token.topics !== undefined && !token.topics.includes(topic)) return refuse(`token is not valid for topic ${topic}`)
  return Either.right({ topic, token })
}

/**
 * A participant's privilege in a topic of `mode`. A promotion or demotion outlives the socket: a
 * participant reconnecting keeps it (`saved` is its membership record, if any).
 */
export const privilegeOf = (mode: "mixed" | "open", saved: Option.Option<Mcpx.Member>, token: Auth.Privilege | undefined): Auth.Privilege =>
  mode === "open"
    ? "full"
    : Option.isSome(saved) && saved.value.assigned === true
    ? saved.value.privilege
    : token ?? "restricted"

/** Makes a participant's actor for each socket the actor host opens, once admitted. */
export const make = (replica: Replica, sequencers: Sequencers) => {
  const { config, link, localTopics, members } = replica
  const room: Room = { config, history: replica.history, members, tracer: replica.tracer, toTopic: replica.toTopic }

  /**
   * While a participant's actor lives here, the stale-broker sweep keeps its topic sequenced.
   * A resource of the actor's scope, not `Effect.addFinalizer`, which keeps the fiber's refs (a
   * Map of about 1 KB) per actor.
   */
  const leave = (topic: string) => {
    const n = (localTopics.get(topic) ?? 1) - 1
    if (n > 0) localTopics.set(topic, n)
    else localTopics.delete(topic)
  }
  const countLocal = (topic: string) =>
    ActorResource.acquireReleaseSync(Effect.sync(() => void localTopics.set(topic, (localTopics.get(topic) ?? 0) + 1)).pipe(Effect.as(topic)), leave)

  return (conn: Actors.Connection, restored: boolean) =>
    Effect.gen(function*() {
      const { token, topic } = yield* admit(conn.open)
      const id = token.sub
      const mode = config.topicModes.get(topic) ?? config.mode
      const saved = Option.map(
        yield* members.get(Subjects.Key.member(topic, id)).pipe(Effect.orElseSucceed(() => Option.none())),
        (entry) => entry.value
      )
      // Moved here (hand-off or adoption) after a newer socket of the same participant joined: that
      // one won while this actor was between replicas. Taking the membership back would close the
      // newer socket, maybe before its welcome, and leave the participant with a socket it closed.
      if (restored && Option.isSome(saved) && saved.value.conn !== conn.id) {
        conn.close(CloseCode.Normal, "replaced")
        return { onFrame: () => {} } satisfies Actors.Actor
      }
      const privilege = privilegeOf(mode, saved, token.privilege)
      yield* sequencers.ensure(topic).pipe(Effect.orDie)
      yield* countLocal(topic)
      const member: Mcpx.Member = {
        topic,
        participant: id,
        privilege,
        conn: conn.id,
        edge: conn.edge,
        joinedAt: Date.now(),
        ...(Option.isSome(saved) && saved.value.assigned === true ? { assigned: true } : {})
      }
      // Last one wins: an older socket of the same participant is closed.
      if (Option.isSome(saved) && saved.value.conn !== conn.id) {
        link.close(Subjects.EdgeId(saved.value.edge), Subjects.ConnId(saved.value.conn), CloseCode.Normal, "replaced")
      }
      yield* members.put(Subjects.Key.member(topic, id), member).pipe(Effect.orDie)
      replica.toTopic(topic, new Mcpx.TopicJoin({ member }))

      return new Participant(room, conn, topic, id, member)
    })
}
