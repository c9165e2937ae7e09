/**
 * The `/v0/ws` participant actor on the embedded bus, with no edge and no sockets: tests stand
 * where the edge stands (`ActorClient`), with the claims an edge verified, and speak MCPx.
 */
import { describe, expect, it } from "@effect/vitest"
import { AuthClient, AuthService, Tokens } from "@switchboard/auth"
import { Bus, Kv, MemoryBus, Peer, Subjects } from "@switchboard/bus"
import { type Auth, Mcpx } from "@switchboard/protocol"
import { Telemetry } from "@switchboard/telemetry"
import * as ActorClient from "@switchboard/testing/ActorClient"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import * as Option from "effect/Option"
import type * as Scope from "effect/Scope"
import * as Broker from "../src/Broker.ts"

const SECRET = "broker-unit-secret-that-is-long-enough-for-hs256"

/** The broker's layer and what it needs; its admin API verifies tokens through auth. */
const broker = (env: Readonly<Record<string, string>>) =>
  Broker.layer.pipe(
    Layer.provideMerge(AuthClient.layer),
    Layer.provideMerge(AuthService.layer),
    Layer.provideMerge(Tokens.layer),
    Layer.provideMerge(Telemetry.disabled),
    Layer.provideMerge(MemoryBus.layer),
    Layer.provide(Layer.setConfigProvider(ConfigProvider.fromMap(new Map(Object.entries({ SWITCHBOARD_JWT_SECRET: SECRET, ...env }))))),
    Layer.provide(Logger.minimumLogLevel(process.env["SB_TEST_LOG"] === "debug" ? LogLevel.Debug : LogLevel.Error))
  )

/** Runs a test body against a fresh broker; the body's clients close before the broker stops. */
const withBroker = <A, E>(body: Effect.Effect<A, E, Bus.Bus | Kv.Kv | Scope.Scope>, env: Readonly<Record<string, string>> = {}) =>
  Effect.scoped(body).pipe(Effect.provide(broker(env)))

interface Envelope {
  readonly id: string
  readonly from: string
  readonly kind: string
  readonly to?: ReadonlyArray<string>
  readonly correlation_id?: string
  readonly payload: Record<string, unknown>
}

const next = (client: ActorClient.ActorClient) => Effect.map(client.nextJson, (u) => u as Envelope)

/** The next envelope that is not presence. */
const nextBut = (client: ActorClient.ActorClient): Effect.Effect<Envelope> =>
  Effect.flatMap(next(client), (e) => (e.kind === "presence" ? nextBut(client) : Effect.succeed(e)))

/** A participant of `topic`, past its welcome. */
const join = (sub: string, topic: string, privilege: Auth.Privilege = "full") =>
  Effect.gen(function*() {
    const client = yield* ActorClient.open("broker", { path: "/v0/ws", query: { topic }, claims: { sub, privilege } })
    const welcome = yield* next(client)
    expect(welcome).toMatchObject({ kind: "system", from: Mcpx.GATEWAY, to: [sub], payload: { event: "welcome" } })
    return client
  })

const envelope = (from: string, id: string, kind = "chat", payload: Record<string, unknown> = { text: id }) => ({
  protocol: Mcpx.PROTOCOL,
  id,
  from,
  kind,
  payload
})

const refusal = (client: ActorClient.ActorClient) =>
  Effect.map(nextBut(client), (e) => ({ code: e.payload["code"], correlation: e.correlation_id }))

describe("the MCPx participant", () => {
  it.live("sends an accepted envelope to every member, the sender included, as it was sent", () =>
    withBroker(Effect.gen(function*() {
      const alice = yield* join("alice", "room")
      const bob = yield* join("bob", "room")
      const sent = envelope("alice", "e1")
      yield* alice.send(sent)
      expect(yield* nextBut(bob)).toMatchObject(sent)
      expect(yield* nextBut(alice)).toMatchObject(sent)
    })))

  it.live("refuses a spoofed sender, a reused id, a system message and a restricted participant's MCP request, each with its code", () =>
    withBroker(Effect.gen(function*() {
      const alice = yield* join("alice", "room")
      yield* alice.send(envelope("bob", "spoof"))
      expect(yield* refusal(alice)).toEqual({ code: "spoofed_from", correlation: "spoof" })
      yield* alice.send(envelope("alice", "once"))
      yield* nextBut(alice)
      yield* alice.send(envelope("alice", "once"))
      expect(yield* refusal(alice)).toEqual({ code: "duplicate_id", correlation: "once" })
      yield* alice.send(envelope("alice", "sys", "system"))
      expect(yield* refusal(alice)).toEqual({ code: "forbidden_kind", correlation: "sys" })
      yield* alice.send("{not json")
      expect(yield* refusal(alice)).toEqual({ code: "invalid_envelope", correlation: undefined })

      const carol = yield* join("carol", "room", "restricted")
      yield* carol.send(envelope("carol", "m1", "mcp", { jsonrpc: "2.0", id: 7, method: "tools/list" }))
      const violation = yield* nextBut(carol)
      expect(violation).toMatchObject({ kind: "mcp", to: ["carol"], correlation_id: "m1", payload: { id: 7, error: { code: -32001 } } })
    })))

  it.live("refuses an envelope over the size limit before reading it, and a flood beyond the burst", () =>
    withBroker(
      Effect.gen(function*() {
        const alice = yield* join("alice", "room")
        yield* alice.send(envelope("alice", "big", "chat", { text: "x".repeat(600) }))
        expect(yield* refusal(alice)).toEqual({ code: "too_large", correlation: undefined })
        for (let i = 0; i < 3; i++) yield* alice.send(envelope("alice", `f${i}`))
        // The refusal comes straight from the actor, the accepted ones through the topic's history.
        const answers = [yield* nextBut(alice), yield* nextBut(alice), yield* nextBut(alice)]
        expect(answers.map((e) => (e.kind === "system" ? `${e.payload["code"]} ${e.correlation_id}` : e.id)).sort()).toEqual(["f0", "f1", "rate_limited f2"])
      }),
      { MCPX_MAX_ENVELOPE: "512", MCPX_RATE: "1", MCPX_BURST: "2" }
    ))

  it.live("an admin's promotion reaches the actor: it says so to the participant, and its MCP requests go through", () =>
    withBroker(Effect.gen(function*() {
      const carol = yield* join("carol", "room", "restricted")
      // As the admin API tells it, once the KV record says so.
      Peer.protocol(Mcpx.ParticipantPeer).tell(Peer.outside(yield* Bus.Bus, "broker"), carol.conn, new Mcpx.PrivilegeChanged({ privilege: "full" }))
      expect(yield* nextBut(carol)).toMatchObject({ kind: "system", payload: { event: "privilege", participant: { id: "carol", privilege: "full" } } })
      const request = envelope("carol", "m2", "mcp", { jsonrpc: "2.0", id: 8, method: "tools/list" })
      yield* carol.send(request)
      expect(yield* nextBut(carol)).toMatchObject(request)
    })))

  it.live("a closed socket's membership is gone from KV, and the others hear that it left", () =>
    withBroker(Effect.gen(function*() {
      const alice = yield* join("alice", "room")
      const bob = yield* join("bob", "room")
      yield* bob.close()
      yield* bob.ended
      expect(yield* next(alice)).toMatchObject({ kind: "presence", payload: { event: "join", participant: { id: "bob" } } })
      expect(yield* next(alice)).toMatchObject({ kind: "presence", payload: { event: "leave", participant: { id: "bob" } } })
      const members = yield* Effect.orDie((yield* Kv.Kv).bucket(Subjects.Bucket.members))
      expect(yield* Effect.orDie(members.get(Subjects.Key.member("room", "bob")))).toEqual(Option.none())
      expect(Option.isSome(yield* Effect.orDie(members.get(Subjects.Key.member("room", "alice"))))).toBe(true)
    })))
})
