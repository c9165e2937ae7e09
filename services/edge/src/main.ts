/** One edge as its own process (needs NATS_URL); run as many as the load needs. */
import { NodeRuntime } from "@effect/platform-node"
import { AuthClient } from "@switchboard/auth"
import { BusConfig } from "@switchboard/bus"
import { Logging, Telemetry } from "@switchboard/telemetry"
import * as Layer from "effect/Layer"
import * as Edge from "./Edge.ts"

Edge.layer().pipe(
  Layer.provide(AuthClient.layer),
  Layer.provide(BusConfig.layer("switchboard-edge")),
  Layer.provide(Telemetry.layer("switchboard-edge")),
  Layer.provide(Logging.layer),
  Layer.launch,
  NodeRuntime.runMain({ disablePrettyLogger: true })
)
