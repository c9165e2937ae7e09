/**
 * The session router: the MCP Proxy Protocol between MCP clients (`/mcp`, active) and browser
 * extensions (`/extension`, passive). Each socket is an actor: an extension's (`ExtensionSession.ts`)
 * or a client's (`ClientSession.ts`), which find each other by connection id wherever either one
 * lives. Other services reach an extension through `router.internal` (`InternalRequests.ts`).
 * This module only wires them, over the replica's shared state (`Replica.ts`).
 */
import { Actors } from "@switchboard/bus"
import { Proxy } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as CdpDiscovery from "./CdpDiscovery.ts"
import * as CdpSession from "./CdpSession.ts"
import * as ClientSession from "./ClientSession.ts"
import * as ExtensionSession from "./ExtensionSession.ts"
import * as InternalRequests from "./InternalRequests.ts"
import * as Replica from "./Replica.ts"

export const make = Effect.gen(function*() {
  const replica = yield* Replica.make
  const extension = ExtensionSession.make(replica)
  const client = ClientSession.make(replica)
  const cdp = CdpSession.make(replica)
  yield* InternalRequests.serve(replica)
  yield* CdpDiscovery.serve(replica)
  yield* Actors.host({
    service: "router",
    protocol: Replica.peers,
    replicaHeartbeat: replica.config.replicaHeartbeat,
    shutdownGrace: replica.config.shutdownGrace,
    handoff: { state: Proxy.HandoffState },
    make: (conn, restored, handedOver) =>
      conn.open.path === "/extension"
        ? extension(conn, restored, handedOver)
        : CdpSession.serves(conn.open.path)
        ? cdp(conn, restored, handedOver)
        : client(conn, restored, handedOver)
  })
})

export const layer = Layer.scopedDiscard(make)
