/**
 * MCPx participants as tests drive them: a socket on `/v0/ws?topic=…` opened with a signed token
 * and greeted by the gateway's welcome before anything else. Presence arrives whenever someone
 * joins or leaves, so `next` skips it unless a test asks for it.
 */
import { expect } from "@effect/vitest"
import type { Auth } from "@switchboard/protocol"
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Queue from "effect/Queue"
import * as Schema from "effect/Schema"
import { randomUUID } from "node:crypto"
import { connect, type TestClient } from "./Client.ts"
import { token } from "./Stack.ts"

export const PROTOCOL = "mcpx/v0.1"
export const GATEWAY = "system:gateway"
export const RFC3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/

export type Kind = "mcp" | "mcp/proposal" | "chat" | "presence" | "system"

/**
 * What the gateway sends, checked loosely (any protocol or kind) so that tests can assert the
 * exact values. Excess properties are kept: an exact `toEqual` must see them.
 */
export const Envelope = Schema.Struct({
  protocol: Schema.String,
  id: Schema.String,
  ts: Schema.optional(Schema.String),
  from: Schema.String,
  to: Schema.optional(Schema.Array(Schema.String)),
  kind: Schema.String,
  correlation_id: Schema.optional(Schema.String),
  payload: Schema.Record({ key: Schema.String, value: Schema.Unknown })
})
export type Envelope = typeof Envelope.Type

const decodeEnvelope = Schema.decodeUnknownEither(Schema.parseJson(Envelope), { onExcessProperty: "preserve" })

/** Anything a participant may put in an envelope; `protocol`, `id` and `from` are filled in when absent. */
export interface Outgoing {
  readonly kind: string
  readonly payload: Readonly<Record<string, unknown>>
  readonly protocol?: string
  readonly id?: string
  readonly from?: string
  readonly to?: ReadonlyArray<string>
  readonly correlation_id?: string
  readonly ts?: string
}

export interface Member {
  readonly id: string
  readonly privilege: Auth.Privilege
}

export interface Participant {
  /** The token's `sub`, which is the participant id. */
  readonly id: string
  /** The privilege the gateway assigned, as its welcome says. */
  readonly privilege: Auth.Privilege
  readonly welcome: Envelope
  readonly socket: TestClient
  /** The next envelope of `kind` (any kind but presence when omitted); another kind fails the test. */
  readonly next: (kind?: Kind) => Effect.Effect<Envelope>
  /** The very next envelope, presence included. */
  readonly nextAny: Effect.Effect<Envelope>
  /**
   * The next `count` envelopes of `kind`, skipping presence, read from the socket in batches: the
   * cheap way to drain a thousand messages from each of a hundred sockets.
   */
  readonly collect: (count: number, kind: Kind) => Effect.Effect<ReadonlyArray<Envelope>>
  /** Sends an envelope, filling `protocol`, `id` and `from`; returns exactly what went out. */
  readonly send: (envelope: Outgoing) => Outgoing & { readonly protocol: string; readonly id: string; readonly from: string }
  /** Sends a frame as is (text, or an object as JSON), for malformed input. */
  readonly sendRaw: (data: string | object) => void
  /** Closes the socket normally and waits until it is closed. */
  readonly leave: Effect.Effect<void>
}

export interface JoinOptions {
  /** The token's `sub`. */
  readonly id: string
  /** The token's `privilege` claim; none by default. */
  readonly privilege?: Auth.Privilege
  /** The token's `topics` claim; none by default. */
  readonly topics?: ReadonlyArray<string>
}

/** `/v0/ws`, with the topic query when there is one. */
export const topicUrl = (ws: string, topic: string | undefined) =>
  topic === undefined ? `${ws}/v0/ws` : `${ws}/v0/ws?topic=${encodeURIComponent(topic)}`

/** Opens a socket for a topic without waiting for anything, for tests about refusals. */
export const open = (ws: string, topic: string | undefined, options: JoinOptions) =>
  Effect.gen(function*() {
    const t = yield* token({
      sub: options.id,
      ...(options.privilege === undefined ? {} : { privilege: options.privilege }),
      ...(options.topics === undefined ? {} : { topics: options.topics })
    })
    return yield* connect(topicUrl(ws, topic), { headers: { authorization: `Bearer ${t}` } })
  })

const parse = (text: string): Effect.Effect<Envelope> =>
  Either.match(decodeEnvelope(text), {
    onLeft: (e) => Effect.dieMessage(`the gateway sent something that is not an envelope: ${text}\n${e.message}`),
    onRight: Effect.succeed
  })

/** What every participant receives when `sent` is accepted: the same envelope, stamped with `ts` unless it had one. */
export const delivered = (sent: Outgoing) => ({ ...sent, ts: sent.ts ?? expect.stringMatching(RFC3339) })

/** The welcome's participant list, sorted by id. */
export const roster = (p: Participant): ReadonlyArray<Member> =>
  [...(p.welcome.payload["participants"] as ReadonlyArray<Member>)].sort((a, b) => a.id.localeCompare(b.id))

/** Joins `topic` at `ws` and checks the welcome (§4.4.1), which must be the first thing to arrive. */
export const join = (ws: string, topic: string, options: JoinOptions) =>
  Effect.gen(function*() {
    const socket = yield* open(ws, topic, options)
    // A closed socket will never deliver more: say so at once instead of timing out. What arrived
    // before the close is still taken by the other side of the race.
    const closedEarly = Effect.flatMap(Deferred.await(socket.closed), ({ code, reason }) =>
      Effect.flatMap(Queue.size(socket.messages), (queued) =>
        queued > 0 ? Effect.never : Effect.dieMessage(`${options.id}'s socket was closed with ${code} "${reason}" while a message was awaited`)))
    const nextAny = Effect.flatMap(Effect.raceFirst(socket.nextText, closedEarly), parse)
    const welcome = yield* nextAny
    expect(welcome).toEqual({
      protocol: PROTOCOL,
      id: expect.any(String),
      ts: expect.stringMatching(RFC3339),
      from: GATEWAY,
      to: [options.id],
      kind: "system",
      payload: {
        event: "welcome",
        participant: { id: options.id, privilege: expect.stringMatching(/^(full|restricted)$/) },
        participants: expect.arrayContaining([welcome.payload["participant"]]),
        protocol: PROTOCOL
      }
    })
    const privilege = (welcome.payload["participant"] as Member).privilege

    const next = (kind?: Kind): Effect.Effect<Envelope> =>
      Effect.flatMap(nextAny, (e) => {
        if (e.kind === "presence" && kind !== "presence") return next(kind)
        if (kind !== undefined && e.kind !== kind) {
          return Effect.dieMessage(`${options.id} expected a ${kind} envelope, got ${JSON.stringify(e)}`)
        }
        return Effect.succeed(e)
      })

    const collect = (count: number, kind: Kind) =>
      Effect.gen(function*() {
        const found: Array<Envelope> = []
        while (found.length < count) {
          // At most what is still missing, so nothing after the last wanted envelope is consumed.
          const batch = yield* Queue.takeBetween(socket.messages, 1, count - found.length)
          for (const text of Chunk.toReadonlyArray(batch)) {
            const e = yield* parse(text)
            if (e.kind === kind) found.push(e)
            else if (e.kind !== "presence") return yield* Effect.dieMessage(`${options.id} expected ${kind} envelopes, got ${text}`)
          }
        }
        return found
      }).pipe(
        Effect.timeoutFail({ duration: "30 seconds", onTimeout: () => new Error(`${options.id}: fewer than ${count} ${kind} envelopes within 30s`) }),
        Effect.orDie
      )

    const send = (envelope: Outgoing) => {
      const full = { protocol: PROTOCOL, id: randomUUID(), from: options.id, ...envelope }
      socket.send(full)
      return full
    }

    const leave = Effect.suspend(() => {
      socket.ws.close(1000, "bye")
      return Deferred.await(socket.closed)
    }).pipe(Effect.asVoid)

    return {
      id: options.id,
      privilege,
      welcome,
      socket,
      next,
      nextAny,
      collect,
      send,
      sendRaw: socket.send,
      leave
    } satisfies Participant
  })

/**
 * Proves that `observers` received nothing else so far: a chat from `from` is the very next
 * envelope each of them gets. The topic is in one order and `from`'s envelopes enter it in the
 * order sent, so whatever `from` caused before (and whatever the gateway did before `from` saw
 * its last answer) would arrive first.
 */
export const barrier = (from: Participant, observers: ReadonlyArray<Participant>) =>
  Effect.gen(function*() {
    const sent = from.send({ kind: "chat", payload: { text: "barrier" } })
    for (const o of observers) expect(yield* o.nextAny).toEqual(delivered(sent))
    return sent
  })

/**
 * JSON text nesting arrays `depth` deep, built without recursion: `[[[…]]]`. Two bytes a level,
 * so a hostile envelope can nest tens of thousands deep within the size limit.
 */
export const nestedJson = (depth: number) => "[".repeat(depth) + "]".repeat(depth)

/** An envelope's JSON text whose payload nests `depth` deep: the same shape `send` fills in. */
export const deepEnvelope = (from: string, depth: number, fields: Readonly<Record<string, string>> = {}) =>
  `{"protocol":"${PROTOCOL}","id":"${randomUUID()}","from":${JSON.stringify(from)},"kind":"chat",${
    Object.entries(fields).map(([k, v]) => `${JSON.stringify(k)}:${JSON.stringify(v)},`).join("")
  }"payload":{"text":"deep","deep":${nestedJson(depth)}}}`

/** An error from the gateway (§4.4 system message), which only its sender receives. */
export const gatewayError = (to: string, code: string, correlationId?: string, reason: RegExp = /\S/) => ({
  protocol: PROTOCOL,
  id: expect.any(String),
  ts: expect.stringMatching(RFC3339),
  from: GATEWAY,
  to: [to],
  kind: "system",
  ...(correlationId === undefined ? {} : { correlation_id: correlationId }),
  payload: { event: "error", code, reason: expect.stringMatching(reason) }
})
