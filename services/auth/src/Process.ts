/**
 * How each service runs as a process of its own: on the bus `NATS_URL` names, traced and logged
 * as `switchboard-<name>`, until SIGTERM/SIGINT. One place, so every service starts and stops alike.
 */
import { NodeRuntime } from "@effect/platform-node"
import { type Bus, BusConfig, type Journal, type Kv } from "@switchboard/bus"
import { Logging, Telemetry } from "@switchboard/telemetry"
import * as Layer from "effect/Layer"
import * as AuthClient from "./AuthClient.ts"

/** A layer that needs only the bus and tracing. */
export const runOnBus = <E>(name: string, service: Layer.Layer<never, E, Bus.Bus | Kv.Kv | Journal.Journal | Telemetry.Tracing>) =>
  service.pipe(
    Layer.provide(BusConfig.layer(`switchboard-${name}`)),
    Layer.provide(Telemetry.layer(`switchboard-${name}`)),
    Layer.provide(Logging.layer),
    Layer.launch,
    NodeRuntime.runMain({ disablePrettyLogger: true })
  )

/** A service that also checks tokens through the auth service. */
export const run = <E>(
  name: string,
  service: Layer.Layer<never, E, Bus.Bus | Kv.Kv | Journal.Journal | Telemetry.Tracing | AuthClient.AuthClient>
) => runOnBus(name, service.pipe(Layer.provide(AuthClient.layer)))
