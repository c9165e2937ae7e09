/** The MCP-B tool registry as its own process (needs NATS_URL). */
import { NodeRuntime } from "@effect/platform-node"
import { AuthClient } from "@switchboard/auth"
import { BusConfig } from "@switchboard/bus"
import { Logging, Telemetry } from "@switchboard/telemetry"
import * as Layer from "effect/Layer"
import * as Registry from "./Registry.ts"

Registry.layer.pipe(
  Layer.provide(AuthClient.layer),
  Layer.provide(BusConfig.layer("switchboard-registry")),
  Layer.provide(Telemetry.layer("switchboard-registry")),
  Layer.provide(Logging.layer),
  Layer.launch,
  NodeRuntime.runMain({ disablePrettyLogger: true })
)
