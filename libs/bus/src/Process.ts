/**
 * How each service runs as a process of its own: on the bus `NATS_URL` names, traced and logged
 * as `switchboard-<name>`, until SIGTERM/SIGINT. One place, so every service starts and stops alike.
 * It lives with the bus, not in a service: every service needs it, and a service that needs a
 * token check provides the auth client itself, so no lib depends on a service.
 */
import { NodeRuntime } from "@effect/platform-node"
import { Settings } from "@switchboard/protocol"
import { Logging, MetricsServer, Telemetry } from "@switchboard/telemetry"
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as Bus from "./Bus.ts"
import * as BusConfig from "./Config.ts"
import type * as Journal from "./Journal.ts"
import type * as Kv from "./Kv.ts"

/**
 * Ends a process that cannot start: one line on stderr naming what to change, and exit code 1,
 * instead of a logged cause with a stack. `npm start` and every service alone end this way.
 */
export const exitWithOneLine = (name: string) => (error: unknown) =>
  Console.error(`${name}: ${Settings.failureLine(error)}`).pipe(
    Effect.zipRight(Effect.sync(() => {
      process.exitCode = 1
    }))
  )

/**
 * A service as a process of its own: a layer that needs only the bus and tracing (one that checks
 * tokens is given `AuthClient.layer` first), with the process's metrics on `METRICS_PORT`. A
 * setting it refuses, or a failure that stops it from starting (NATS out of reach, a port in use), ends the process with one line on stderr and
 * exit code 1, as `npm start` does, instead of a logged cause with a stack.
 */
export const run = <E>(name: string, service: Layer.Layer<never, E, Bus.Bus | Kv.Kv | Journal.Journal | Telemetry.Tracing>) =>
  Layer.merge(service, MetricsServer.layer).pipe(
    Layer.provide(BusConfig.layer(`switchboard-${name}`, { alone: true })),
    Layer.provide(Telemetry.layer(`switchboard-${name}`)),
    Layer.provide(Logging.layer),
    Layer.launch,
    Effect.catchAll(exitWithOneLine(`switchboard-${name}`)),
    NodeRuntime.runMain({ disablePrettyLogger: true })
  )
