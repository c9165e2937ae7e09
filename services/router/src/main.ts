/** The session router as its own process (needs NATS_URL). */
import { NodeRuntime } from "@effect/platform-node"
import { AuthClient } from "@switchboard/auth"
import { BusConfig } from "@switchboard/bus"
import { Logging, Telemetry } from "@switchboard/telemetry"
import * as Layer from "effect/Layer"
import * as Router from "./Router.ts"

Router.layer.pipe(
  Layer.provide(AuthClient.layer),
  Layer.provide(BusConfig.layer("switchboard-router")),
  Layer.provide(Telemetry.layer("switchboard-router")),
  Layer.provide(Logging.layer),
  Layer.launch,
  NodeRuntime.runMain({ disablePrettyLogger: true })
)
