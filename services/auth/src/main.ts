/** The auth service as its own process: answers `auth.verify` on NATS. */
import { NodeRuntime } from "@effect/platform-node"
import { BusConfig } from "@switchboard/bus"
import { Logging, Telemetry } from "@switchboard/telemetry"
import * as Layer from "effect/Layer"
import * as AuthService from "./AuthService.ts"
import * as Tokens from "./Tokens.ts"

AuthService.layer.pipe(
  Layer.provide(Tokens.layer),
  Layer.provide(BusConfig.layer("switchboard-auth")),
  Layer.provide(Telemetry.layer("switchboard-auth")),
  Layer.provide(Logging.layer),
  Layer.launch,
  NodeRuntime.runMain({ disablePrettyLogger: true })
)
