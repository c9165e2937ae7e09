/**
 * An edge whose NATS node dies reconnects to another node, but core NATS kept nothing for it
 * meanwhile: an MCPx envelope the broker sent to its sockets in that gap is gone, and the sender
 * had its echo. So the edge closes its sockets with 1012 once its connection is back, and each
 * client reconnects and reads what it missed from the topic's history, as after any reconnect.
 * (The chaos suite once lost an acknowledged envelope this way.)
 */
import { expect, layer } from "@effect/vitest"
import { Broker } from "@switchboard/broker"
import { Edge } from "@switchboard/edge"
import { Registry } from "@switchboard/registry"
import { NatsCluster } from "@switchboard/testing"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import { closedWith } from "./support/Client.ts"
import { join } from "./support/Participants.ts"
import { sseStream } from "./support/Sse.ts"
import { busLayer, namespace, replica, stack, token } from "./support/Stack.ts"

layer(NatsCluster.layer, { excludeTestServices: true, timeout: "120 seconds" })("an edge that loses its NATS node", (it) => {
  it.scoped("closes its sockets with 1012 and ends its event streams once it is back on another node, and the room goes on", () =>
    Effect.gen(function*() {
      const cluster = yield* NatsCluster
      const ns = namespace()
      // The edge knows only node 0 (it learns the others from the cluster); the broker is on node 1.
      // State is on all three nodes, as in production, so that the room outlives node 0.
      const ctx = yield* Layer.build(stack(busLayer([cluster.servers[0]!], ns, 3))).pipe(
        // A fresh cluster places R3 streams once every node has joined (0.8 to 4 s, TESTCONTAINERS.md).
        Effect.retry({ while: (e) => e instanceof Error && /no suitable peers/.test(e.message), schedule: Schedule.spaced("250 millis"), times: 40 })
      )
      const base = Context.get(ctx, Edge.EdgeServer).url
      const ws = base.replace("http", "ws")
      for (const service of [Broker.layer, Registry.layer]) {
        const started = yield* replica(service, [cluster.servers[1]!], ns, {}, 3)
        yield* Effect.addFinalizer(() => started.stop)
      }

      // A Streamable HTTP session with its GET stream open on this edge.
      const t = yield* token({ sub: "alice" })
      const headers = { authorization: `Bearer ${t}`, accept: "application/json, text/event-stream", "content-type": "application/json" }
      const session = yield* Effect.promise(async () => {
        const res = await fetch(`${base}/hub`, {
          method: "POST",
          headers,
          body: JSON.stringify({ jsonrpc: "2.0", id: 0, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "0" } } })
        })
        await res.text()
        return res.headers.get("mcp-session-id")
      })
      if (session === null) return yield* Effect.dieMessage("initialize returned no Mcp-Session-Id")
      const stream = yield* sseStream(base, t, session, "2025-06-18")

      const alice = yield* join(ws, "bus-loss", { id: "alice" })
      const bob = yield* join(ws, "bus-loss", { id: "bob" })
      const before = alice.send({ kind: "chat", payload: { text: "before" } })
      expect((yield* bob.next("chat")).id).toBe(before.id)

      yield* cluster.kill(0)
      const [a, b] = yield* Effect.all([closedWith(alice.socket), closedWith(bob.socket)], { concurrency: 2 })
      for (const closed of [a, b]) expect(closed).toEqual({ code: 1012, reason: "the edge lost its connection to the bus: reconnect" })
      // The stream ends too: its client opens it again, from its Last-Event-ID.
      yield* stream.ended.pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("the GET stream did not end") }), Effect.orDie)

      // Back on the same edge, now on another node: the room is there. Until the streams that node 0
      // led have new leaders, a session may be refused or closed with 1013 (its open timed out); a
      // client starts over, as these do.
      yield* Effect.gen(function*() {
        const again = yield* join(ws, "bus-loss", { id: "alice" })
        const carol = yield* join(ws, "bus-loss", { id: "carol" })
        const after = again.send({ kind: "chat", payload: { text: "after" } })
        expect((yield* carol.next("chat")).id).toBe(after.id)
      }).pipe(
        Effect.scoped,
        Effect.catchAllDefect((d) => Effect.fail(d)),
        Effect.retry({ schedule: Schedule.spaced("500 millis"), times: 40 }),
        Effect.orDie
      )
      yield* cluster.restart(0)
    }), 90_000)
})
