/**
 * MCPx v0.1 over real sockets: the gateway's welcome and presence, privilege enforcement (§3,
 * §4.4.2) in mixed and open mode, envelope validation and its errors, replacement of a
 * participant's older socket, limits, and one total order per topic across three edges on NATS.
 * Everything but the last runs on the embedded bus, where a test is about the broker's logic.
 */
import { describe, expect, it } from "@effect/vitest"
import { AuthClient, AuthService, Tokens } from "@switchboard/auth"
import { Broker } from "@switchboard/broker"
import { Edge } from "@switchboard/edge"
import { Telemetry } from "@switchboard/telemetry"
import { NatsServer } from "@switchboard/testing"
import * as Cause from "effect/Cause"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import * as Queue from "effect/Queue"
import type * as Scope from "effect/Scope"
import { closedWith, connect, UpgradeRefused } from "./support/Client.ts"
import {
  barrier,
  delivered,
  type Envelope,
  GATEWAY,
  gatewayError,
  join,
  type Member,
  open,
  type Outgoing,
  type Participant,
  PROTOCOL,
  RFC3339,
  roster,
  topicUrl
} from "./support/Participants.ts"
import { busLayer, configFrom, namespace, serve, token } from "./support/Stack.ts"

/** Edge, auth and broker on the embedded bus; returns the edge's ws:// base URL. */
const start = (env: Record<string, string> = {}) => Effect.map(serve(Broker.layer, env), (s) => s.ws)

/** §4.4.2, verbatim: what a restricted participant gets back for a `kind: "mcp"` envelope. */
const privilegeViolation = (to: string, correlationId: string, rpcId: unknown) => ({
  protocol: PROTOCOL,
  id: expect.any(String),
  ts: expect.stringMatching(RFC3339),
  from: GATEWAY,
  to: [to],
  kind: "mcp",
  correlation_id: correlationId,
  payload: {
    jsonrpc: "2.0",
    id: rpcId,
    error: {
      code: -32001,
      message: "Privilege violation",
      data: {
        reason: "Restricted participants cannot send MCP messages directly",
        suggestion: "Use kind: 'mcp/proposal' instead"
      }
    }
  }
})

/** A join or leave as everyone else in the topic sees it: broadcast, so no `to`. */
const presence = (event: "join" | "leave", participant: Member) => ({
  protocol: PROTOCOL,
  id: expect.any(String),
  ts: expect.stringMatching(RFC3339),
  from: GATEWAY,
  kind: "presence",
  payload: { event, participant }
})

/** Each of `participants` receives `sent` unchanged, `ts` stamped when it had none. */
const allReceive = (participants: ReadonlyArray<Participant>, sent: Outgoing) =>
  Effect.forEach(participants, (p) => Effect.map(p.next(), (e) => expect(e).toEqual(delivered(sent))), { discard: true })

const toolCall = (rpcId: number) => ({
  jsonrpc: "2.0",
  id: rpcId,
  method: "tools/call",
  params: { name: "dangerous_operation", arguments: { target: "production" } }
})

/** The HTTP status an upgrade was refused with, or what happened instead. */
const refusal = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.either(effect).pipe(
    Effect.map((r) => (r._tag === "Right" ? "accepted" : r.left instanceof UpgradeRefused ? r.left.status : `failed: ${String(r.left)}`))
  )

describe("MCPx gateway", () => {
  it.scopedLive("welcomes each participant with its privilege and everyone present, and tells the others of joins and leaves", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const alice = yield* join(ws, "lobby", { id: "alice", privilege: "full" })
      expect(alice.welcome.payload).toEqual({
        event: "welcome",
        participant: { id: "alice", privilege: "full" },
        participants: [{ id: "alice", privilege: "full" }],
        protocol: PROTOCOL
      })

      // No privilege claim: restricted, in the default (mixed) mode.
      const bob = yield* join(ws, "lobby", { id: "bob" })
      expect(bob.privilege).toBe("restricted")
      expect(roster(bob)).toEqual([{ id: "alice", privilege: "full" }, { id: "bob", privilege: "restricted" }])
      expect(yield* alice.nextAny).toEqual(presence("join", { id: "bob", privilege: "restricted" }))

      const carol = yield* join(ws, "lobby", { id: "carol", privilege: "restricted" })
      expect(roster(carol)).toEqual([
        { id: "alice", privilege: "full" },
        { id: "bob", privilege: "restricted" },
        { id: "carol", privilege: "restricted" }
      ])
      for (const p of [alice, bob]) expect(yield* p.nextAny).toEqual(presence("join", { id: "carol", privilege: "restricted" }))

      // Another topic is another room: dave is neither listed nor announced here, nor they to him.
      const dave = yield* join(ws, "elsewhere", { id: "dave", privilege: "full" })
      expect(roster(dave)).toEqual([{ id: "dave", privilege: "full" }])

      yield* bob.leave
      for (const p of [alice, carol]) expect(yield* p.nextAny).toEqual(presence("leave", { id: "bob", privilege: "restricted" }))
      const erin = yield* join(ws, "lobby", { id: "erin", privilege: "full" })
      expect(roster(erin).map((m) => m.id)).toEqual(["alice", "carol", "erin"])
      for (const p of [alice, carol]) expect(yield* p.nextAny).toEqual(presence("join", { id: "erin", privilege: "full" }))

      yield* barrier(alice, [alice, carol, erin])
      yield* barrier(dave, [dave])
    }))

  it.scopedLive("runs the restricted workflow of §9.1: blocked call, proposal, fulfilment by a human, answer seen by all", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const human = yield* join(ws, "ops", { id: "human-user", privilege: "full" })
      const target = yield* join(ws, "ops", { id: "target-agent", privilege: "full" })
      const agent = yield* join(ws, "ops", { id: "untrusted-agent" })
      expect(agent.privilege).toBe("restricted")
      const everyone = [human, target, agent]

      // 2. A direct call is blocked: only the agent hears about it, in §4.4.2's exact words.
      agent.send({ id: "env-bad-call", to: ["target-agent"], kind: "mcp", payload: toolCall(45) })
      expect(yield* agent.next()).toEqual(privilegeViolation("untrusted-agent", "env-bad-call", 45))

      // 3. The proposal is the next thing anyone sees, the agent included: the blocked call never went out.
      const proposal = agent.send({
        id: "env-req-1",
        to: ["target-agent"],
        kind: "mcp/proposal",
        payload: { method: "tools/call", params: toolCall(0).params, reason: "Need to perform maintenance" }
      })
      for (const p of everyone) expect(yield* p.next()).toEqual(delivered(proposal))

      // 4–5. The human fulfils it with a real call. `to` names the target, yet everyone sees it.
      const call = human.send({ id: "env-fulfill-1", to: ["target-agent"], kind: "mcp", payload: toolCall(44) })
      yield* allReceive(everyone, call)

      // 6. The target answers the human and the proposer; the answer is visible to all.
      const answer = target.send({
        id: "env-fulfill-resp-1",
        to: ["human-user", "untrusted-agent"],
        kind: "mcp",
        correlation_id: "env-fulfill-1",
        payload: { jsonrpc: "2.0", id: 44, result: { content: [{ type: "text", text: "Operation completed successfully" }] } }
      })
      yield* allReceive(everyone, answer)
      yield* barrier(human, everyone)
    }))

  it.scopedLive("in mixed mode (the default) humans are full and new agents restricted; restricted may chat, propose and announce", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const human = yield* join(ws, "mixed", { id: "human", privilege: "full" })
      const newcomer = yield* join(ws, "mixed", { id: "new-agent" })
      const demoted = yield* join(ws, "mixed", { id: "known-restricted", privilege: "restricted" })
      expect([human.privilege, newcomer.privilege, demoted.privilege]).toEqual(["full", "restricted", "restricted"])
      expect(roster(demoted)).toEqual([
        { id: "human", privilege: "full" },
        { id: "known-restricted", privilege: "restricted" },
        { id: "new-agent", privilege: "restricted" }
      ])
      const everyone = [human, newcomer, demoted]

      yield* allReceive(everyone, newcomer.send({ kind: "chat", payload: { text: "hello", format: "plain" } }))
      yield* allReceive(everyone, demoted.send({ kind: "mcp/proposal", to: ["human"], payload: { method: "resources/read", params: { uri: "file:///x" } } }))
      // Presence from a participant is an envelope like any other: it reaches everyone, unchanged.
      const status = newcomer.send({ kind: "presence", payload: { event: "status", status: "busy" } })
      for (const p of everyone) expect(yield* p.next("presence")).toEqual(delivered(status))

      for (const restricted of [newcomer, demoted]) {
        const blocked = restricted.send({ kind: "mcp", to: ["human"], payload: toolCall(7) })
        expect(yield* restricted.next()).toEqual(privilegeViolation(restricted.id, blocked.id, 7))
      }
      yield* allReceive(everyone, human.send({ kind: "mcp", to: ["new-agent"], payload: toolCall(8) }))
      yield* barrier(human, everyone)
    }))

  it.scopedLive("MCPX_MODE=open makes everyone full, whatever the token says, and their mcp passes", () =>
    Effect.gen(function*() {
      const ws = yield* start({ MCPX_MODE: "open" })
      const human = yield* join(ws, "open", { id: "human", privilege: "full" })
      const agent = yield* join(ws, "open", { id: "agent" })
      const marked = yield* join(ws, "open", { id: "marked", privilege: "restricted" })
      expect(roster(marked)).toEqual([
        { id: "agent", privilege: "full" },
        { id: "human", privilege: "full" },
        { id: "marked", privilege: "full" }
      ])
      const everyone = [human, agent, marked]
      yield* allReceive(everyone, agent.send({ kind: "mcp", to: ["human"], payload: toolCall(1) }))
      yield* allReceive(everyone, marked.send({ kind: "mcp", to: ["human"], payload: toolCall(2) }))
      yield* barrier(human, everyone)
    }))

  it.scopedLive("MCPX_TOPIC_MODES overrides the mode per topic, both ways", () =>
    Effect.gen(function*() {
      const mixed = yield* start({ MCPX_MODE: "mixed", MCPX_TOPIC_MODES: "lab=open,prod=mixed" })
      const inLab = yield* join(mixed, "lab", { id: "agent" })
      const inProd = yield* join(mixed, "prod", { id: "agent" })
      const inOther = yield* join(mixed, "other", { id: "agent" })
      expect([inLab.privilege, inProd.privilege, inOther.privilege]).toEqual(["full", "restricted", "restricted"])
      yield* allReceive([inLab], inLab.send({ kind: "mcp", payload: toolCall(1) }))
      const blocked = inProd.send({ kind: "mcp", payload: toolCall(2) })
      expect(yield* inProd.next()).toEqual(privilegeViolation("agent", blocked.id, 2))

      const open = yield* start({ MCPX_MODE: "open", MCPX_TOPIC_MODES: "prod=mixed" })
      const openProd = yield* join(open, "prod", { id: "agent" })
      const openOther = yield* join(open, "other", { id: "agent" })
      const trusted = yield* join(open, "prod", { id: "human", privilege: "full" })
      expect([openProd.privilege, openOther.privilege, trusted.privilege]).toEqual(["restricted", "full", "full"])
      yield* allReceive([openOther], openOther.send({ kind: "mcp", payload: toolCall(3) }))
      const blockedToo = openProd.send({ kind: "mcp", payload: toolCall(4) })
      expect(yield* openProd.next()).toEqual(privilegeViolation("agent", blockedToo.id, 4))
      yield* barrier(trusted, [openProd, trusted])
    }))

  it.scopedLive("refuses spoofed from, duplicate ids and kind system with an error to the sender only; the socket stays open", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const alice = yield* join(ws, "errors", { id: "alice", privilege: "full" })
      const bob = yield* join(ws, "errors", { id: "bob", privilege: "full" })
      expect(yield* alice.nextAny).toEqual(presence("join", { id: "bob", privilege: "full" }))
      const both = [alice, bob]

      for (const from of ["bob", GATEWAY, ""]) {
        alice.send({ id: `spoof-${from}`, from, kind: "chat", payload: { text: "it was bob" } })
        expect(yield* alice.nextAny).toEqual(gatewayError("alice", "spoofed_from", `spoof-${from}`))
      }
      yield* barrier(alice, both)

      const first = alice.send({ id: "dup-1", kind: "chat", payload: { text: "once" } })
      yield* allReceive(both, first)
      alice.send({ id: "dup-1", kind: "chat", payload: { text: "twice" } })
      expect(yield* alice.nextAny).toEqual(gatewayError("alice", "duplicate_id", "dup-1"))
      yield* barrier(alice, both)
      // Ids are unique per participant: another participant may use the same one.
      yield* allReceive(both, bob.send({ id: "dup-1", kind: "chat", payload: { text: "mine" } }))

      // Only the gateway speaks `system`, whatever the sender's privilege.
      alice.send({ id: "sys-1", kind: "system", payload: { event: "welcome" } })
      expect(yield* alice.nextAny).toEqual(gatewayError("alice", "forbidden_kind", "sys-1"))
      yield* barrier(alice, both)
    }))

  it.scopedLive("answers malformed frames and wrong shapes with invalid_envelope; nothing is delivered and the socket stays open", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const alice = yield* join(ws, "shapes", { id: "alice", privilege: "full" })
      const bob = yield* join(ws, "shapes", { id: "bob", privilege: "full" })
      expect(yield* alice.nextAny).toEqual(presence("join", { id: "bob", privilege: "full" }))
      const valid = { protocol: PROTOCOL, from: "alice", kind: "chat", payload: { text: "hi" } }
      const without = (id: string, field: string) =>
        Object.fromEntries(Object.entries({ ...valid, id }).filter(([k]) => k !== field))

      // [what, frame, the correlation_id the error carries (only for a string id)]
      const cases: ReadonlyArray<readonly [string, string | object, string | undefined]> = [
        ["not JSON", "{not json", undefined],
        ["a JSON array", "[1,2]", undefined],
        ["a JSON string", JSON.stringify("hello"), undefined],
        ["JSON null", "null", undefined],
        ["an unknown protocol", { ...valid, id: "bad-protocol", protocol: "mcpx/v9" }, "bad-protocol"],
        ["no protocol", without("no-protocol", "protocol"), "no-protocol"],
        ["a numeric id", { ...valid, id: 42 }, undefined],
        ["no id", without("", "id"), undefined],
        ["an unknown kind", { ...valid, id: "bad-kind", kind: "telepathy" }, "bad-kind"],
        ["no kind", without("no-kind", "kind"), "no-kind"],
        ["a from that is not a string", { ...valid, id: "bad-from", from: 7 }, "bad-from"],
        ["no from", without("no-from", "from"), "no-from"],
        ["a to that is not an array", { ...valid, id: "bad-to", to: "bob" }, "bad-to"],
        ["a to holding a number", { ...valid, id: "bad-to-item", to: ["bob", 1] }, "bad-to-item"],
        ["a correlation_id that is not a string", { ...valid, id: "bad-correlation", correlation_id: 5 }, "bad-correlation"],
        ["a payload that is an array", { ...valid, id: "array-payload", payload: [] }, "array-payload"],
        ["a payload that is a string", { ...valid, id: "string-payload", payload: "hi" }, "string-payload"],
        ["a null payload", { ...valid, id: "null-payload", payload: null }, "null-payload"],
        ["no payload", without("no-payload", "payload"), "no-payload"]
      ]
      for (const [what, frame, correlationId] of cases) {
        alice.sendRaw(frame)
        expect(yield* alice.nextAny, what).toEqual(gatewayError("alice", "invalid_envelope", correlationId))
      }
      // An empty id is no id; whether the error echoes "" is not specified.
      alice.sendRaw({ ...valid, id: "" })
      const empty = yield* alice.nextAny
      expect({ ...empty, correlation_id: undefined }).toEqual(gatewayError("alice", "invalid_envelope"))

      yield* barrier(alice, [alice, bob])
    }))

  it.scopedLive("accepts mcp-x/v0 envelopes, keeps a given ts and passes to and correlation_id through unchanged", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const alice = yield* join(ws, "v0", { id: "alice", privilege: "full" })
      const bob = yield* join(ws, "v0", { id: "bob" })
      const both = [alice, bob]
      const v0 = alice.send({ protocol: "mcp-x/v0", kind: "chat", payload: { text: "from a v0 client" } })
      yield* allReceive(both, v0)
      const stamped = alice.send({
        protocol: "mcp-x/v0",
        ts: "2025-08-26T14:00:00Z",
        to: ["bob"],
        correlation_id: v0.id,
        kind: "mcp",
        payload: toolCall(9)
      })
      for (const p of both) expect(yield* p.next()).toEqual(stamped)
      // A v0 client is still subject to its privilege; the gateway answers in v0.1.
      const blocked = bob.send({ protocol: "mcp-x/v0", kind: "mcp", payload: toolCall(10) })
      expect(yield* bob.next()).toEqual(privilegeViolation("bob", blocked.id, 10))
      yield* barrier(bob, both)
    }))

  it.scopedLive("refuses a topic outside the token's topics and a missing topic with 1008, and a bad or missing token with 401", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const scoped = { id: "alice", privilege: "full", topics: ["lobby", "lab"] } as const
      const member = yield* join(ws, "lab", scoped)
      const outside = yield* open(ws, "ops", scoped)
      expect((yield* closedWith(outside)).code).toBe(1008)
      const noTopic = yield* open(ws, undefined, { id: "bob", privilege: "full" })
      expect((yield* closedWith(noTopic)).code).toBe(1008)

      expect(yield* refusal(connect(topicUrl(ws, "lab")))).toBe(401)
      expect(yield* refusal(connect(`${topicUrl(ws, "lab")}&token=garbage`))).toBe(401)
      const forged = (yield* token({ sub: "mallory", privilege: "full" })).slice(0, -3) + "abc"
      expect(yield* refusal(connect(topicUrl(ws, "lab"), { headers: { authorization: `Bearer ${forged}` } }))).toBe(401)

      // The token may also come as ?token=.
      const byQuery = yield* connect(`${topicUrl(ws, "lab")}&token=${yield* token({ sub: "carol" })}`)
      expect(yield* byQuery.next).toMatchObject({ kind: "system", to: ["carol"], payload: { event: "welcome", participant: { id: "carol" } } })
      // The refused never joined: carol's join is the only presence the member saw.
      expect(yield* member.nextAny).toEqual(presence("join", { id: "carol", privilege: "restricted" }))
      yield* barrier(member, [member])
    }))

  it.scopedLive("replaces a participant's older socket with 1000 replaced, and the others see no extra leave or join", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const first = yield* join(ws, "dup", { id: "alice", privilege: "full" })
      const bob = yield* join(ws, "dup", { id: "bob", privilege: "full" })
      expect(yield* first.nextAny).toEqual(presence("join", { id: "bob", privilege: "full" }))

      const second = yield* join(ws, "dup", { id: "alice", privilege: "full" })
      expect(yield* closedWith(first.socket)).toEqual({ code: 1000, reason: "replaced" })
      expect(roster(second)).toEqual([{ id: "alice", privilege: "full" }, { id: "bob", privilege: "full" }])
      // The old socket's close is handled by now: a leave or join for alice would come before this.
      yield* barrier(second, [second, bob])

      yield* allReceive([second], bob.send({ kind: "chat", payload: { text: "still there?" } }))
      expect(yield* bob.next()).toMatchObject({ from: "bob" })
      // One alice, so one leave when she goes.
      yield* second.leave
      expect(yield* bob.nextAny).toEqual(presence("leave", { id: "alice", privilege: "full" }))
      yield* barrier(bob, [bob])
    }))

  it.scopedLive("closes a participant beyond MCPX_MAX_PARTICIPANTS with 1008 topic is full; a returning participant still fits", () =>
    Effect.gen(function*() {
      const ws = yield* start({ MCPX_MAX_PARTICIPANTS: "2" })
      const alice = yield* join(ws, "small", { id: "alice", privilege: "full" })
      const bob = yield* join(ws, "small", { id: "bob", privilege: "full" })
      expect(yield* alice.nextAny).toEqual(presence("join", { id: "bob", privilege: "full" }))
      const carol = yield* open(ws, "small", { id: "carol", privilege: "full" })
      expect(yield* closedWith(carol)).toEqual({ code: 1008, reason: "topic is full" })
      expect(yield* Queue.size(carol.messages)).toBe(0)
      // The limit is per topic.
      yield* join(ws, "roomy", { id: "carol", privilege: "full" })
      // Alice replacing her own socket adds nobody, so she is let in.
      const again = yield* join(ws, "small", { id: "alice", privilege: "full" })
      expect(yield* closedWith(alice.socket)).toEqual({ code: 1000, reason: "replaced" })
      yield* barrier(again, [again, bob])
    }))

  it.scopedLive("answers the message over the rate with rate_limited (MCPX_RATE=5, MCPX_BURST=5)", () =>
    Effect.gen(function*() {
      const ws = yield* start({ MCPX_RATE: "5", MCPX_BURST: "5" })
      const alice = yield* join(ws, "rate", { id: "alice", privilege: "full" })
      const bob = yield* join(ws, "rate", { id: "bob", privilege: "full" })
      const sent = Array.from({ length: 6 }, (_, i) => alice.send({ kind: "chat", payload: { text: `quick ${i}` } }))
      const accepted = sent.slice(0, 5)
      const over = sent[5]
      if (over === undefined) return yield* Effect.dieMessage("six were sent")

      // The sender gets its five back and one error, in some order; the sixth goes to nobody.
      const seen: Array<Envelope> = []
      for (let i = 0; i < 6; i++) seen.push(yield* alice.next())
      expect(seen.filter((e) => e.kind === "system")).toEqual([gatewayError("alice", "rate_limited", over.id)])
      expect(seen.filter((e) => e.kind === "chat")).toEqual(accepted.map(delivered))
      for (const e of accepted) expect(yield* bob.next()).toEqual(delivered(e))
      yield* barrier(bob, [bob, alice])
    }))

  it.scopedLive("answers an envelope over MCPX_MAX_ENVELOPE with too_large and delivers one under it", () =>
    Effect.gen(function*() {
      const ws = yield* start()
      const alice = yield* join(ws, "large", { id: "alice", privilege: "full" })
      const bob = yield* join(ws, "large", { id: "bob", privilege: "full" })
      // 60,000 characters fit in the default 65,536 bytes; 70,000 do not (the edge takes up to 1 MiB).
      yield* allReceive([alice, bob], alice.send({ kind: "chat", payload: { text: "a".repeat(60_000) } }))
      const big = alice.send({ kind: "chat", payload: { text: "a".repeat(70_000) } })
      const error = yield* alice.nextAny
      // A gateway may refuse before parsing, so the id is echoed only if it read it.
      expect(error).toEqual(gatewayError("alice", "too_large", error.correlation_id === undefined ? undefined : big.id))
      yield* barrier(alice, [alice, bob])
    }))
})

const quiet = Logger.minimumLogLevel(LogLevel.Error)
const PARTICIPANTS = 100
const SENDERS = 10
const PER_SENDER = 100

/** Three edges and the broker as layers of their own, each on its own NATS connection. */
const overNats = Effect.gen(function*() {
  const { servers } = yield* NatsServer
  const ns = namespace()
  const connection = () => Layer.merge(Telemetry.disabled, busLayer(servers, ns))
  const broker = Broker.layer.pipe(
    Layer.provideMerge(AuthClient.layer),
    Layer.provideMerge(AuthService.layer),
    Layer.provideMerge(Tokens.layer),
    Layer.provideMerge(connection()),
    // Ordering is under test here, not the limiter.
    Layer.provide(configFrom({ MCPX_RATE: "10000", MCPX_BURST: "10000", MCPX_CHAT_RATE: "10000", MCPX_CHAT_BURST: "10000" })),
    Layer.provide(quiet)
  )
  const edge = Edge.layer().pipe(Layer.provideMerge(AuthClient.layer), Layer.provideMerge(connection()), Layer.provide(configFrom({})), Layer.provide(quiet))
  yield* Layer.build(broker)
  return yield* Effect.forEach([0, 1, 2], () => Effect.map(Layer.build(edge), (ctx) => Context.get(ctx, Edge.EdgeServer).url.replace("http", "ws")))
})

/** Participant `i`'s edge: participants are dealt over the edges in turn. */
const edgeFor = (edges: ReadonlyArray<string>, i: number) => edges[i % edges.length] ?? ""

const withNats = <A, E>(test: Effect.Effect<A, E, NatsServer | Scope.Scope>) => Effect.scoped(test).pipe(Effect.provide(NatsServer.layer))

/** What went wrong with one join, in a line: the test reports every participant left out, not just the first. */
const failureOf = (who: string) => (exit: Exit.Exit<unknown, unknown>) =>
  Exit.isSuccess(exit) ? [] : [`${who}: ${Cause.pretty(exit.cause).split("\n")[0]}`]

describe("MCPx gateway on NATS", () => {
  it.live("welcomes everyone who joins a new topic at the same moment, on any edge", () =>
    Effect.gen(function*() {
      const edges = yield* overNats
      // Many fresh topics, so that joins meet the broker while it is still setting each topic up.
      const failures = yield* Effect.forEach(
        Array.from({ length: 40 }, (_, t) => `fresh-${t}`),
        (topic) =>
          Effect.forEach(
            Array.from({ length: 10 }, (_, i) => `p${i}`),
            (id, i) => Effect.map(Effect.exit(join(edgeFor(edges, i), topic, { id, privilege: "full" })), failureOf(`${topic}/${id}`)),
            { concurrency: "unbounded" }
          ),
        { concurrency: 10 }
      )
      expect(failures.flat().flat()).toEqual([])
    }).pipe(withNats), 60_000)

  it.live(`${PARTICIPANTS} participants on three edges all receive ${SENDERS * PER_SENDER} concurrent chats in the same order`, () =>
    Effect.gen(function*() {
      const edges = yield* overNats
      const joined = yield* Effect.forEach(
        Array.from({ length: PARTICIPANTS - 1 }, (_, i) => i),
        (i) => join(edgeFor(edges, i), "crowd", { id: `p${i}`, privilege: "full" }),
        { concurrency: "unbounded" }
      )
      const last = yield* join(edgeFor(edges, PARTICIPANTS - 1), "crowd", { id: `p${PARTICIPANTS - 1}`, privilege: "full" })
      expect(roster(last)).toHaveLength(PARTICIPANTS)
      const everyone = [...joined, last]

      // Round robin over senders on all three edges, so their envelopes meet at the broker.
      const senders = everyone.slice(0, SENDERS)
      const sent = new Map<string, ReturnType<Participant["send"]>>()
      for (let n = 0; n < PER_SENDER; n++) {
        for (const s of senders) {
          const e = s.send({ kind: "chat", payload: { text: `${s.id} #${n}` } })
          sent.set(e.id, e)
        }
      }

      const received = yield* Effect.forEach(everyone, (p) => p.collect(sent.size, "chat"), { concurrency: "unbounded" })
      const orders = received.map((es) => es.map((e) => e.id))
      const [reference = []] = orders
      expect([...reference].sort()).toEqual([...sent.keys()].sort())
      for (const e of received[0] ?? []) expect(e).toEqual(delivered(sent.get(e.id) ?? { kind: "missing", payload: {} }))
      const disagreeing = orders.flatMap((order, i) => {
        const at = order.findIndex((id, k) => id !== reference[k])
        return at === -1 ? [] : [`${everyone[i]?.id} differs from p0 at position ${at}`]
      })
      expect(disagreeing).toEqual([])
    }).pipe(withNats), 60_000)
})
