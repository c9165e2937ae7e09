/**
 * The registry's peer protocol (`Registry.RegistryPeer`) on the embedded bus: a tab's answer told
 * from elsewhere crosses the bus encoded and reaches the hub's actor typed, a message that is not
 * one of the protocol's is logged and dropped, and the one request the registry makes, asking the
 * router to open a tab, is a typed ask whose failures (nobody listens, the router refuses) reach
 * the client as the call's error.
 */
import { describe, expect, it } from "@effect/vitest"
import { Bus, Peer, Subjects } from "@switchboard/bus"
import { JsonRpc, Proxy, Registry } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Queue from "effect/Queue"
import * as Replica from "../src/Replica.ts"
import { eventually, hub, tab, toolsUntil, withRegistry } from "./Harness.ts"

const NAME = "website_tool_shop_example_com_tab1_getCart"
const CACHED = "website_tool_mail_example_net_compose"

/** A sender on another replica, or none: everything it tells goes over the bus. */
const elsewhere = Effect.map(Bus.Bus, (bus) => Peer.outside(bus, "registry"))

describe("the registry's peer protocol", () => {
  it.live("a tab's answer told over the bus reaches the hub's call, and only from the tab the call went to", () =>
    withRegistry(Effect.gen(function*() {
      const shop = yield* tab({ user: "alice", tabId: 1, url: "https://shop.example.com/", tools: ["getCart"] })
      const h = yield* hub("alice")
      yield* toolsUntil(h, (names) => names.includes(NAME))
      yield* h.client.send({ jsonrpc: "2.0", id: 7, method: "tools/call", params: { name: NAME } })
      const execute = yield* shop.nextMessage
      expect(typeof execute.id).toBe("string")
      const from = yield* elsewhere
      const mapped = execute.id
      if (typeof mapped !== "string") throw new Error(`the tab's execute request has no string id: ${JSON.stringify(execute)}`)
      const answer = (payload: string) => ({ jsonrpc: "2.0" as const, id: mapped, result: { success: true, payload } })
      // In order on the hub's subject: the forged answer is handled, and dropped, before the real one.
      Replica.peers.tell(from, h.client.conn, { _tag: "FromTab", tab: "another-tab-conn", message: answer("forged") })
      Replica.peers.tell(from, h.client.conn, { _tag: "FromTab", tab: shop.client.conn, message: answer("over the bus") })
      expect(yield* h.responseTo(7)).toEqual({ jsonrpc: "2.0", id: 7, result: { content: [{ type: "text", text: "over the bus" }] } })
    })))

  it.live("a message that does not decode, or is none of the registry's, is logged and dropped; the session carries on", () => {
    const logs: Array<string> = []
    return withRegistry(
      Effect.gen(function*() {
        const shop = yield* tab({ user: "alice", tabId: 1, url: "https://shop.example.com/", tools: ["getCart"] })
        const h = yield* hub("alice")
        yield* toolsUntil(h, (names) => names.includes(NAME))
        const bus = yield* Bus.Bus
        const subject = Subjects.conn("registry", h.client.conn)
        const peer = (kind: string) => ({ [Subjects.Header.op]: "peer", [Subjects.Header.kind]: kind })
        yield* bus.publish(subject, JSON.stringify({ _tag: "FromTab", tab: shop.client.conn, message: "not an object" }), peer("FromTab"))
        yield* bus.publish(subject, "{not json", peer("Wake"))
        // The string kind the registry's actors used before their protocol was typed.
        yield* bus.publish(subject, JSON.stringify({ tab: shop.client.conn, message: {} }), peer("from-tab"))
        yield* eventually(Effect.sync(() => logs.filter((l) => l.startsWith("peer: dropped a message")).length === 3), "three dropped messages logged")
        expect(logs.some((l) => l.includes("malformed FromTab"))).toBe(true)
        expect(logs.some((l) => l.includes("malformed Wake"))).toBe(true)
        expect(logs.some((l) => l.includes(`unknown peer message kind "from-tab"`))).toBe(true)

        const called = yield* Effect.fork(h.request("tools/call", { name: NAME }))
        const execute = yield* shop.nextMessage
        yield* shop.client.send({ jsonrpc: "2.0", id: execute.id, result: { success: true, payload: "still here" } })
        expect((yield* called.await.pipe(Effect.flatten)).result).toEqual({ content: [{ type: "text", text: "still here" }] })
      }),
      {},
      logs
    )
  })

  it.live("a cached tool with no tab asks the router to open one: no router answers PeerUnavailable, a refusal comes back typed", () =>
    withRegistry(Effect.gen(function*() {
      const first = yield* tab({
        user: "alice",
        tabId: 5,
        url: "https://mail.example.net/inbox",
        tools: [{ name: "compose", inputSchema: { type: "object" }, annotations: { cache: true } }]
      })
      const h = yield* hub("alice")
      yield* toolsUntil(h, (names) => names.includes(CACHED))
      yield* first.client.close()
      yield* first.client.ended
      yield* toolsUntil(h, (names) => names.length === 1 && names[0] === CACHED)

      // No router replica on the bus: the ask has no receiver, and the call fails at once.
      const nobody = yield* h.request("tools/call", { name: CACHED })
      expect(nobody.error).toEqual({
        code: Registry.TabNotFound,
        message: "TabNotFound: no open tab of mail.example.net has compose, and opening https://mail.example.net/inbox failed: " +
          "The router is unavailable: no router replica is running"
      })

      // A router that refuses: its typed failure crosses the bus and becomes the call's error.
      const asked = yield* Queue.unbounded<Proxy.InternalRequest>()
      const routerPeers = Peer.protocol(Proxy.RouterPeer)
      yield* routerPeers.serve(Subjects.routerInternal, (message, reply) => {
        if (message._tag !== "InternalRequest") return
        Queue.unsafeOffer(asked, message)
        return reply(message).fail(new Proxy.InternalFailure({ code: JsonRpc.ErrorCode.ServerError, message: "No browser extension is connected" }))
      })
      const bus = yield* Bus.Bus
      yield* bus.flush
      const refused = yield* h.request("tools/call", { name: CACHED })
      expect(refused.error).toEqual({
        code: Registry.TabNotFound,
        message: "TabNotFound: no open tab of mail.example.net has compose, and opening https://mail.example.net/inbox failed: No browser extension is connected"
      })
      const request = yield* Queue.take(asked)
      // Decoded into the request class, not a loose record.
      expect(request).toBeInstanceOf(Proxy.InternalRequest)
      expect({ user: request.user, method: request.method, params: request.params }).toEqual({
        user: "alice",
        method: "createTab",
        params: { url: "https://mail.example.net/inbox" }
      })
    })))
})
