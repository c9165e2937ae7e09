/** The MCPx topic broker as its own process (needs NATS_URL). */
import { NodeRuntime } from "@effect/platform-node"
import { AuthClient } from "@switchboard/auth"
import { BusConfig } from "@switchboard/bus"
import { Logging, Telemetry } from "@switchboard/telemetry"
import * as Layer from "effect/Layer"
import * as Broker from "./Broker.ts"

Broker.layer.pipe(
  Layer.provide(AuthClient.layer),
  Layer.provide(BusConfig.layer("switchboard-broker")),
  Layer.provide(Telemetry.layer("switchboard-broker")),
  Layer.provide(Logging.layer),
  Layer.launch,
  NodeRuntime.runMain({ disablePrettyLogger: true })
)
