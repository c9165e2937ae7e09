/**
 * The broker's HTTP API, which the edge forwards over the bus: promote and demote a participant
 * (spec §10.3; an `admin` token), and list topics and their participants, scoped to what the
 * caller's token may see. Every privilege change is logged as an audit event.
 */
import { AuthClient } from "@switchboard/auth"
import { Bus, Journal, Kv, Peer, Subjects } from "@switchboard/bus"
import { type Auth, Edge, Json, Mcpx } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as Schema from "effect/Schema"
import * as BrokerConfig from "./Config.ts"

/** What the edge forwards: plain HTTP requests under the broker's paths. */
const httpPeers = Peer.protocol(Edge.ServiceHttp)
/** Whether an answer can go back as JSON (a body with a BigInt, say, cannot): checked before it is sent. */
const encodeResponse = Schema.encodeEither(Schema.parseJson(Edge.HttpResponse))

/** What participants' actors hear from the rest of the broker: this API's privilege changes (see Broker.ts). */
export const participantPeers = Peer.protocol(Mcpx.ParticipantPeer)

const respond = (status: number, body: unknown): Edge.HttpResponse => ({ status, body })
const problem = (status: number, error: string) => respond(status, { error })
/** How long a client turned away for too many history reads waits before it asks again. */
const HISTORY_RETRY_AFTER_SECONDS = 1

/** A path segment as the client meant it; a malformed `%` escape is the client's error (400), not a throw. */
const segment = (raw: string): Effect.Effect<string, Edge.HttpResponse> => {
  try {
    return Effect.succeed(decodeURIComponent(raw))
  } catch {
    return Effect.fail(problem(400, `malformed percent-encoding in the path segment ${JSON.stringify(raw)}`))
  }
}

const PRIVILEGE_PATH = /^\/admin\/participants\/([^/]+)\/(promote|demote)$/
const PARTICIPANTS_PATH = /^\/v0\/topics\/([^/]+)\/participants$/
const HISTORY_PATH = /^\/v0\/topics\/([^/]+)\/history$/
const MAX_HISTORY_PAGE = 1_000

export const make = Effect.gen(function*() {
  const bus = yield* Bus.Bus
  const toActors = Peer.outside(bus, "broker")
  const auth = yield* AuthClient.AuthClient
  const members = Kv.typed(yield* (yield* Kv.Kv).bucket(Subjects.Bucket.members), Mcpx.Member)
  const journal = yield* (yield* Journal.Journal).open(yield* BrokerConfig.history)
  const pageBytes = yield* BrokerConfig.historyPageBytes
  const maxWaiting = yield* BrokerConfig.historyReadsWaiting
  /**
   * A page costs a few times its bytes while it is read, decoded and written out, so the reads one
   * process runs at once are bounded: a few wait their turn (a page takes milliseconds), and past
   * those a read is turned away at once rather than queued behind work its client may give up on.
   */
  const reads = yield* BrokerConfig.historyReads
  const readers = yield* Effect.makeSemaphore(reads)
  /** Reads running or waiting for `readers`. */
  let pending = 0
  const tooBusy: Edge.HttpResponse = {
    ...problem(503, "too many history reads at once; retry shortly"),
    retryAfter: HISTORY_RETRY_AFTER_SECONDS
  }
  const boundedRead = <E, R>(read: Effect.Effect<Edge.HttpResponse, E, R>) =>
    Effect.suspend(() => {
      if (pending >= reads + maxWaiting) return Effect.succeed(tooBusy)
      pending++
      return readers.withPermits(1)(read).pipe(Effect.ensuring(Effect.sync(() => pending--)))
    })

  const caller = (request: Edge.HttpRequest) => {
    const m = /^Bearer\s+(.+)$/i.exec(request.authorization ?? "")
    if (m === null) return Effect.fail(problem(401, "a bearer token is required"))
    return auth.verify(m[1]!).pipe(
      Effect.mapError((e) => (e._tag === "AuthFailed" ? problem(401, `invalid token: ${e.reason}`) : problem(503, e.reason)))
    )
  }
  const maySee = (claims: Auth.Claims, topic: string) => claims.admin === true || claims.topics === undefined || claims.topics.includes(topic)

  const changePrivilege = (claims: Auth.Claims, participant: string, action: "promote" | "demote", topic: string | undefined) =>
    Effect.gen(function*() {
      if (claims.admin !== true) return problem(403, "an admin token is required")
      const next: Auth.Privilege = action === "promote" ? "full" : "restricted"
      const found = (yield* members.values()).filter(
        ({ value }) => value.participant === participant && (topic === undefined || value.topic === topic)
      )
      if (found.length === 0) return problem(404, `participant ${participant} is not in ${topic === undefined ? "any topic" : `topic ${topic}`}`)
      const old = found[0]!.value.privilege
      for (const { key, value } of found) {
        yield* members.put(key, { ...value, privilege: next, assigned: true })
        // The actor (on whichever replica) applies it and tells the participant.
        participantPeers.tell(toActors, Subjects.ConnId(value.conn), new Mcpx.PrivilegeChanged({ privilege: next }))
      }
      const at = new Date().toISOString()
      const topics = found.map(({ value }) => value.topic)
      yield* Effect.logInfo(`audit: ${claims.sub} ${action}d ${participant} to ${next}`).pipe(
        Effect.annotateLogs({ audit: action, participant, by: claims.sub, topics: topics.join(","), oldPrivilege: old, newPrivilege: next })
      )
      const verb = action === "promote" ? "promoted" : "demoted"
      return respond(200, { participantId: participant, oldPrivilege: old, newPrivilege: next, [`${verb}By`]: claims.sub, [`${verb}At`]: at, topics })
    })

  const listTopics = (claims: Auth.Claims) =>
    Effect.map(members.values(), (all) => {
      const counts = new Map<string, number>()
      for (const { value } of all) if (maySee(claims, value.topic)) counts.set(value.topic, (counts.get(value.topic) ?? 0) + 1)
      return respond(200, { topics: [...counts].map(([name, participants]) => ({ name, participants })) })
    })

  const listParticipants = (claims: Auth.Claims, topic: string) =>
    maySee(claims, topic)
      ? Effect.map(members.values(Subjects.Key.members(topic)), (found) =>
        respond(200, { topic, participants: found.map(({ value }) => ({ id: value.participant, privilege: value.privilege })) }))
      : Effect.succeed(problem(403, `token is not valid for topic ${topic}`))

  /**
   * The newest `limit` envelopes before the `before` cursor that fit in MCPX_HISTORY_PAGE_BYTES,
   * oldest first, the cursor for the page before, and whether there is one.
   */
  const history = (claims: Auth.Claims, topic: string, query: Readonly<Record<string, string>>) =>
    Effect.gen(function*() {
      if (!maySee(claims, topic)) return problem(403, `token is not valid for topic ${topic}`)
      const limit = query["limit"] === undefined ? 100 : Number(query["limit"])
      const before = query["before"] === undefined ? undefined : Number(query["before"])
      if (!Number.isInteger(limit) || limit < 1 || limit > MAX_HISTORY_PAGE) return problem(400, `limit is 1 to ${MAX_HISTORY_PAGE}`)
      if (before !== undefined && (!Number.isInteger(before) || before < 1)) return problem(400, "before is a sequence number from an earlier page")
      return yield* boundedRead(historyPage(topic, limit, before))
    })

  const historyPage = (topic: string, limit: number, before: number | undefined) =>
    Effect.gen(function*() {
      // A topic nobody spoke in has no entries; it is a subject of the one history, never a stream of its own.
      const page = yield* journal.read(Subjects.historyKey(topic), { limit, maxBytes: pageBytes, ...(before === undefined ? {} : { before }) })
      // The bound is on what goes out, and an envelope written again can be longer than it was
      // stored (`1e20` becomes 21 digits): measured again, newest first, the first always kept.
      const envelopes: Array<unknown> = []
      let bytes = 0
      let oldest = page.entries.length
      for (let i = page.entries.length - 1; i >= 0; i--) {
        const entry = page.entries[i]!
        const parsed = Json.parse(Bus.text(entry))
        // One entry that cannot be read (stored before a limit existed, say) must not cost the page.
        if (Either.isLeft(parsed)) {
          yield* Effect.logWarning(`history of topic ${topic}: skipped entry ${entry.seq}: ${parsed.left}`)
          oldest = i
          continue
        }
        const size = Buffer.byteLength(JSON.stringify(parsed.right))
        if (envelopes.length > 0 && bytes + size > pageBytes) break
        bytes += size
        envelopes.push(parsed.right)
        oldest = i
      }
      envelopes.reverse()
      const more = page.more || oldest > 0
      return respond(200, { topic, envelopes, before: oldest < page.entries.length ? page.entries[oldest]!.seq : null, more })
    })

  const route = (request: Edge.HttpRequest) =>
    Effect.gen(function*() {
      const claims = yield* caller(request)
      const privilege = PRIVILEGE_PATH.exec(request.path)
      if (privilege !== null) {
        if (request.method !== "POST") return problem(405, "use POST")
        return yield* changePrivilege(claims, yield* segment(privilege[1]!), privilege[2] as "promote" | "demote", request.query["topic"])
      }
      if (request.method !== "GET") return problem(405, "use GET")
      if (request.path === "/v0/topics") return yield* listTopics(claims)
      const participants = PARTICIPANTS_PATH.exec(request.path)
      if (participants !== null) return yield* listParticipants(claims, yield* segment(participants[1]!))
      const past = HISTORY_PATH.exec(request.path)
      if (past !== null) return yield* history(claims, yield* segment(past[1]!), request.query)
      return problem(404, `no such endpoint: ${request.path}`)
    }).pipe(
      Effect.catchTag("BusError", (e) => Effect.succeed(problem(503, e.message))),
      Effect.merge
    )

  /** Every request gets an answer: a defect is logged and answered 500, never left to the edge's timeout. */
  const answer = (request: Edge.HttpForward) =>
    route(request).pipe(
      Effect.annotateLogs({ method: request.method, path: request.path }),
      Effect.catchAllCause((cause) => Effect.as(Effect.logError("the HTTP API failed", cause), problem(500, "internal error"))),
      Effect.flatMap((response) =>
        Either.isRight(encodeResponse(response))
          ? Effect.succeed(response)
          : Effect.as(Effect.logError("could not encode an HTTP answer"), problem(500, "could not encode the answer"))
      )
    )

  yield* httpPeers.serve(
    Subjects.http("broker"),
    (message, reply) => Effect.flatMap(answer(message), reply(message).succeed),
    { queue: Subjects.Queue.service("broker") }
  )
})

export const layer = Layer.scopedDiscard(make)
