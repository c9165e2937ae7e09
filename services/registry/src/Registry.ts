/**
 * The tool registry: the MCP-B hub (`shared/specs/mcp-b.md`) as a service. Tab bridges connect at
 * `/tabs` and register their page's tools (`TabSession.ts`); MCP clients connect at `/hub` and see
 * all their user's tools as one MCP server (`HubSession.ts`, with its calls in `ToolCall.ts`), and
 * MCP 2026-07-28 requests, which need no session, reach any replica (`Stateless.ts`, with its
 * tasks in `Tasks.ts`).
 * This module only wires them: one actor per connection, the replica's shared state
 * (`Replica.ts`), and the sweep of tab entries left behind (`StaleTabSweep.ts`).
 */
import { Actors } from "@switchboard/bus"
import { Registry } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as HubSession from "./HubSession.ts"
import * as Replica from "./Replica.ts"
import * as StaleTabSweep from "./StaleTabSweep.ts"
import * as Stateless from "./Stateless.ts"
import * as TabSession from "./TabSession.ts"

export const make = Effect.gen(function*() {
  const replica = yield* Replica.make
  const tab = TabSession.make(replica)
  const hub = HubSession.make(replica)
  const host = yield* Actors.host({
    service: "registry",
    replica: replica.id,
    protocol: Replica.peers,
    replicaHeartbeat: replica.config.replicaHeartbeat,
    shutdownGrace: replica.config.shutdownGrace,
    handoff: { state: Registry.HubHandoff },
    make: (conn, restored, handedOver) => (conn.open.path === "/tabs" ? tab(conn, restored) : hub(conn, restored, handedOver))
  })
  yield* Stateless.serve(replica, host.inbox)
  yield* StaleTabSweep.run(replica)
})

export const layer = Layer.scopedDiscard(make)
