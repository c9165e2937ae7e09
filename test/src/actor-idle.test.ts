/**
 * Issue 16: an idle connection's actor holds no fiber. A fiber waiting for the socket to close, a
 * keepalive sleeping in one, or an authentication deadline, each kept a stack and fiber refs for
 * the connection's whole life, most of what an idle socket cost the all-in-one. Every fiber the
 * router forks is tracked by a supervisor: a crowd of idle, authenticated MCP clients and
 * extensions (each with a status keepalive) adds none, while the keepalives still go out.
 */
import { describe, expect, it } from "@effect/vitest"
import { Router } from "@switchboard/router"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import * as Supervisor from "effect/Supervisor"
import { client, extension } from "./support/ProxyPeers.ts"
import { serve, token } from "./support/Stack.ts"

const IDLE = 40
/** Fibers still finishing the last handshakes when counted. */
const SLACK = 10

describe("idle actors", () => {
  it.scopedLive("idle authenticated sockets add no fiber to the router, and their keepalives still run", () =>
    Effect.gen(function*() {
      const fibers = yield* Supervisor.track
      const { ws } = yield* serve(Router.layer.pipe(Layer.provide(Supervisor.addSupervisor(fibers))), { ROUTER_STATUS_INTERVAL: "300 millis" })
      const live = Effect.map(fibers.value, (all) => all.length)
      // One of each first: what the router starts once (a budget sweep, a KV watch) is not per socket.
      yield* client(ws, "alice")
      yield* extension(ws, { name: "Chrome", accessToken: yield* token({ sub: "alice" }) })
      const before = yield* live
      const clients = yield* Effect.forEach(Array.from({ length: IDLE }, (_, i) => `user${i}`), (user) => client(ws, user))
      const extensions = yield* Effect.forEach(
        Array.from({ length: IDLE }, (_, i) => i),
        (i) => Effect.flatMap(token({ sub: `user${i}` }), (accessToken) => extension(ws, { name: `Browser ${i}`, accessToken }))
      )
      // The fibers that answered the handshakes end soon after; what is left is what idle sockets
      // keep. A fiber per socket would be 80 more; a few are allowed for work still finishing.
      const settled = yield* live.pipe(
        Effect.filterOrFail((n) => n <= before + SLACK, (n) => n),
        Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 250 }),
        Effect.either
      )
      expect(settled).toEqual(Either.right(expect.any(Number)))
      // Timers, not fibers, and still running: every idle socket hears its keepalive.
      const statuses = yield* Effect.forEach([...clients, ...extensions.map((e) => e.c)], (c) =>
        Effect.repeat(Effect.map(c.next, (m) => (m as { method?: string }).method), { until: (method) => method === "status" }))
      expect(statuses.every((method) => method === "status")).toBe(true)
    }))
})
