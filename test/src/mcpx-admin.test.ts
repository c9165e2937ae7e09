/**
 * The broker's HTTP API through the edge's port: trust promotion (spec §9.2, §10.3) and demotion
 * with an admin token, and topic/participant listings scoped to the caller's token.
 */
import { describe, expect, it } from "@effect/vitest"
import { Broker } from "@switchboard/broker"
import { Edge } from "@switchboard/edge"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { GATEWAY, join, PROTOCOL, RFC3339 } from "./support/Participants.ts"
import { busLayer, stack, token } from "./support/Stack.ts"

const start = Effect.gen(function*() {
  const ctx = yield* Layer.build(stack(busLayer(), { services: Broker.layer }))
  const url = (ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape).url
  return { http: url, ws: url.replace("http", "ws") }
})

const api = (url: string, method: string, bearer?: string) =>
  Effect.promise(async () => {
    const res = await fetch(url, { method, headers: bearer === undefined ? {} : { authorization: `Bearer ${bearer}` } })
    return { status: res.status, body: (await res.json()) as Record<string, unknown> }
  })

const toolCall = (id: number) => ({ kind: "mcp", to: ["target"], payload: { jsonrpc: "2.0", id, method: "tools/call", params: { name: "deploy" } } })

describe("MCPx admin API", () => {
  it.scopedLive("promotes a restricted agent (§9.2): it is told, and its mcp messages pass; demotion blocks them again", () =>
    Effect.gen(function*() {
      const { http, ws } = yield* start
      const admin = yield* token({ sub: "admin-user", admin: true })
      const human = yield* join(ws, "lab", { id: "human", privilege: "full" })
      const agent = yield* join(ws, "lab", { id: "agent" })
      expect(agent.privilege).toBe("restricted")
      const blocked = agent.send(toolCall(1))
      expect(yield* agent.next("mcp")).toMatchObject({ correlation_id: blocked.id, payload: { error: { code: -32001 } } })

      const promoted = yield* api(`${http}/admin/participants/agent/promote?topic=lab`, "POST", admin)
      expect(promoted).toEqual({
        status: 200,
        body: {
          participantId: "agent",
          oldPrivilege: "restricted",
          newPrivilege: "full",
          promotedBy: "admin-user",
          promotedAt: expect.stringMatching(RFC3339),
          topics: ["lab"]
        }
      })
      expect(yield* agent.next("system")).toMatchObject({
        protocol: PROTOCOL,
        from: GATEWAY,
        to: ["agent"],
        kind: "system",
        payload: { event: "privilege", participant: { id: "agent", privilege: "full" } }
      })
      const passes = agent.send(toolCall(2))
      expect(yield* human.next("mcp")).toMatchObject({ id: passes.id, from: "agent", payload: { id: 2 } })
      expect(yield* agent.next("mcp")).toMatchObject({ id: passes.id })

      // A newcomer's welcome lists the promoted privilege; a reconnect keeps it.
      const late = yield* join(ws, "lab", { id: "late", privilege: "full" })
      expect(late.welcome.payload["participants"]).toEqual(expect.arrayContaining([{ id: "agent", privilege: "full" }]))

      const demoted = yield* api(`${http}/admin/participants/agent/demote?topic=lab`, "POST", admin)
      expect(demoted.body).toMatchObject({ participantId: "agent", oldPrivilege: "full", newPrivilege: "restricted", demotedBy: "admin-user" })
      expect((yield* agent.next("system")).payload).toEqual({ event: "privilege", participant: { id: "agent", privilege: "restricted" } })
      const again = agent.send(toolCall(3))
      expect(yield* agent.next("mcp")).toMatchObject({ correlation_id: again.id, payload: { error: { code: -32001 } } })
    }))

  it.scopedLive("refuses callers without a token (401), without the admin claim (403), and unknown participants (404)", () =>
    Effect.gen(function*() {
      const { http, ws } = yield* start
      yield* join(ws, "lab", { id: "agent" })
      const path = `${http}/admin/participants/agent/promote`
      expect((yield* api(path, "POST")).status).toBe(401)
      expect((yield* api(path, "POST", "garbage")).status).toBe(401)
      expect(yield* api(path, "POST", yield* token({ sub: "mallory", privilege: "full" }))).toEqual({
        status: 403,
        body: { error: "an admin token is required" }
      })
      const admin = yield* token({ sub: "root", admin: true })
      expect((yield* api(`${http}/admin/participants/nobody/promote`, "POST", admin)).status).toBe(404)
      expect((yield* api(`${http}/admin/participants/agent/promote?topic=elsewhere`, "POST", admin)).status).toBe(404)
      expect((yield* api(path, "GET", admin)).status).toBe(405)
    }))

  it.scopedLive("lists topics and participants within what the token may see", () =>
    Effect.gen(function*() {
      const { http, ws } = yield* start
      yield* join(ws, "alpha", { id: "a1" })
      yield* join(ws, "alpha", { id: "a2", privilege: "full" })
      yield* join(ws, "beta", { id: "b1" })
      const scoped = yield* token({ sub: "viewer", topics: ["alpha"] })
      expect(yield* api(`${http}/v0/topics`, "GET", scoped)).toEqual({ status: 200, body: { topics: [{ name: "alpha", participants: 2 }] } })
      const all = yield* api(`${http}/v0/topics`, "GET", yield* token({ sub: "root", admin: true }))
      expect((all.body["topics"] as Array<unknown>).length).toBe(2)
      const people = yield* api(`${http}/v0/topics/alpha/participants`, "GET", scoped)
      expect(people.status).toBe(200)
      expect(people.body["participants"]).toEqual(expect.arrayContaining([{ id: "a1", privilege: "restricted" }, { id: "a2", privilege: "full" }]))
      expect((yield* api(`${http}/v0/topics/beta/participants`, "GET", scoped)).status).toBe(403)
      expect((yield* api(`${http}/v0/topics`, "GET")).status).toBe(401)
    }))

  it.scopedLive("keeps a topic's history: a late joiner reads what it missed, page by page", () =>
    Effect.gen(function*() {
      const { http, ws } = yield* start
      const alice = yield* join(ws, "log", { id: "alice" })
      const sent = Array.from({ length: 5 }, (_, i) => alice.send({ kind: "chat", payload: { text: `m${i}` } }))
      yield* alice.collect(5, "chat")
      yield* alice.leave
      // Bob was not there; the history has everything, in the topic's order, ts stamped.
      const bob = yield* token({ sub: "bob", topics: ["log"] })
      const page = yield* api(`${http}/v0/topics/log/history?limit=3`, "GET", bob)
      expect(page.status).toBe(200)
      const texts = (body: Record<string, unknown>) =>
        (body["envelopes"] as Array<{ readonly payload: { readonly text: string } }>).map((e) => e.payload.text)
      expect(texts(page.body)).toEqual(["m2", "m3", "m4"])
      expect((page.body["envelopes"] as Array<Record<string, unknown>>)[0]).toMatchObject({ id: sent[2]!.id, from: "alice", ts: expect.stringMatching(RFC3339) })
      const earlier = yield* api(`${http}/v0/topics/log/history?limit=3&before=${page.body["before"]}`, "GET", bob)
      expect(texts(earlier.body)).toEqual(["m0", "m1"])
      expect((yield* api(`${http}/v0/topics/log/history?limit=0`, "GET", bob)).status).toBe(400)
      const stranger = yield* token({ sub: "eve", topics: ["elsewhere"] })
      expect((yield* api(`${http}/v0/topics/log/history`, "GET", stranger)).status).toBe(403)
    }))

  it.scopedLive("limits chat on its own (MCPX_CHAT_RATE), without holding back other kinds", () =>
    Effect.gen(function*() {
      const ctx = yield* Layer.build(stack(busLayer(), { services: Broker.layer, env: { MCPX_CHAT_RATE: "1", MCPX_CHAT_BURST: "2" } }))
      const ws = (ctx.unsafeMap.get(Edge.EdgeServer.key) as Edge.EdgeServerShape).url.replace("http", "ws")
      const talker = yield* join(ws, "chatty", { id: "talker" })
      const [a, b, c] = [0, 1, 2].map((i) => talker.send({ kind: "chat", payload: { text: `c${i}` } }))
      // The refusal goes straight back while accepted envelopes pass the topic's sequencer, so
      // the three may arrive in any order.
      const got = yield* Effect.forEach([0, 1, 2], () => talker.nextAny)
      expect(got.filter((e) => e.kind === "chat").map((e) => e.id).sort()).toEqual([a!.id, b!.id].sort())
      expect(got.find((e) => e.kind === "system")).toMatchObject({ correlation_id: c!.id, payload: { event: "error", code: "rate_limited" } })
      const proposal = talker.send({ kind: "mcp/proposal", payload: { method: "tools/list", params: {} } })
      expect((yield* talker.next("mcp/proposal")).id).toBe(proposal.id)
    }))
})
