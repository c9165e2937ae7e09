/**
 * Every service and the edge in one process, on one bus: the embedded one by default, NATS when
 * `NATS_URL` is set. Production runs the same layers one per process (each service's main.ts).
 */
import { AuthClient, AuthService, Tokens } from "@switchboard/auth"
import * as AuthConfig from "@switchboard/auth/Config"
import { Broker, BrokerConfig } from "@switchboard/broker"
import { BusConfig, Process } from "@switchboard/bus"
import { Edge, EdgeConfig } from "@switchboard/edge"
import { Registry } from "@switchboard/registry"
import * as RegistryConfig from "@switchboard/registry/Config"
import { Router } from "@switchboard/router"
import * as RouterConfig from "@switchboard/router/Config"
import { Logging, MetricsServer, Telemetry } from "@switchboard/telemetry"
import * as Config from "effect/Config"
import * as Console from "effect/Console"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import { portFree } from "./PortCheck.ts"

const devToken = (tokens: Tokens.TokensShape) =>
  Effect.gen(function*() {
    // A day, or SWITCHBOARD_JWT_MAX_LIFETIME if that is shorter: a longer one would be refused.
    const ttl = Option.match(tokens.maxLifetime, { onNone: () => Duration.hours(24), onSome: (max) => Duration.min(Duration.hours(24), max) })
    const token = yield* Effect.orDie(tokens.issue({ sub: "dev", ttl, privilege: "full", admin: true }))
    yield* Console.log(
      [
        "",
        "SWITCHBOARD_JWT_SECRET is not set: this run uses a random secret, so tokens die with the process.",
        `Development token (sub=dev, privilege=full, admin, valid ${Duration.equals(ttl, Duration.hours(24)) ? "24h" : Duration.format(ttl)}):`,
        "",
        `  ${token}`,
        "",
        "Set SWITCHBOARD_JWT_SECRET to keep tokens across restarts and mint more with `npm run token -- --sub <user>`.",
        ""
      ].join("\n")
    )
  })

/**
 * The services, wired to whatever Bus, Kv and Tracing are provided. The edge is ready once all of
 * them run: they start with it, so a client that connects as soon as `/readyz` says so finds them.
 */
export const services = Layer.mergeAll(Edge.layer({ awaitEveryService: true }), Router.layer, Broker.layer, Registry.layer).pipe(
  Layer.provideMerge(AuthService.layer),
  Layer.provideMerge(AuthClient.layer),
  Layer.provide(Tokens.layerWithDevFallback(devToken))
)

/**
 * One metrics endpoint (`METRICS_PORT`) for the whole process: every service's metrics and the
 * edge's. The edge's own `/metrics` on `PORT` stays the edge's alone, as on a separate edge.
 */
export const layer = Layer.merge(services, MetricsServer.layer).pipe(
  Layer.provide(BusConfig.layer("switchboard")),
  Layer.provide(Telemetry.layer("switchboard")),
  Layer.provide(Logging.layer)
)

/** Every setting the process reads, so that a bad one is refused before anything starts or prints. */
export const settings = Config.all(
  [AuthConfig, BrokerConfig, BusConfig, EdgeConfig, Logging, MetricsServer, RegistryConfig, RouterConfig, { endpoint: Telemetry.otlpEndpoint }].flatMap((module) =>
    Object.values(module).filter(Config.isConfig)
  )
)

/**
 * `npm start`: an invalid setting ends the process with one line on stderr and exit code 1, before
 * the dev token is printed, and so does a `PORT` in use; only then do the layers start (and run until
 * SIGTERM/SIGINT). What stops them from starting (NATS out of reach) ends it the same way.
 */
export const main = settings.pipe(
  Effect.zipRight(portFree),
  Effect.zipRight(Layer.launch(layer)),
  Effect.catchAll(Process.exitWithOneLine("switchboard"))
)
