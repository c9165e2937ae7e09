/**
 * The edge: terminates WebSockets and moves raw text frames between sockets and the bus, knowing
 * nothing about the protocols above. This module is the layer: it reads the settings, builds the
 * three parts (the upgrade, the socket I/O, the HTTP routes) over one HTTP server, hands what
 * services send to the part that holds its connection (`Outbound.ts`), beats this
 * edge's heartbeat, and shuts them down in order.
 */
import type { AuthClient } from "@switchboard/auth"
import { Bus, Kv, Subjects } from "@switchboard/bus"
import { Edge as EdgeProtocol, Json, Settings } from "@switchboard/protocol"
import { Metrics, type Telemetry } from "@switchboard/telemetry"
import type * as ConfigError from "effect/ConfigError"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import { randomBytes } from "node:crypto"
import * as Http from "node:http"
import * as Boundary from "./Boundary.ts"
import * as EdgeConfig from "./Config.ts"
import * as HttpRoutes from "./HttpRoutes.ts"
import { EdgeMetrics } from "./Metrics.ts"
import * as OriginPolicy from "./OriginPolicy.ts"
import * as Outbound from "./Outbound.ts"
import { type HttpRouteTable, routeKey, type RouteTable, standard, standardHttp } from "./Routes.ts"
import * as Sockets from "./Sockets.ts"
import { Turn } from "./Turn.ts"
import * as Upgrade from "./Upgrade.ts"

export interface EdgeServerShape {
  readonly id: Subjects.EdgeId
  /** The bound port (useful with PORT=0). */
  readonly port: number
  readonly url: string
  readonly metrics: EdgeMetrics
  readonly connections: () => number
}

export class EdgeServer extends Context.Tag("@switchboard/edge/EdgeServer")<EdgeServer, EdgeServerShape>() {}

export interface EdgeOptions {
  readonly routes?: RouteTable
  readonly httpRoutes?: HttpRouteTable
  /** Readiness waits for every service behind the edge (see `HttpRoutesOptions.awaitEveryService`). */
  readonly awaitEveryService?: boolean
}

const heartbeat = Json.codec(EdgeProtocol.EdgeHeartbeat)

const make = (options: EdgeOptions) =>
  Effect.gen(function*() {
    const kv = yield* Kv.Kv
    const bus = yield* Bus.Bus
    const routes = options.routes ?? standard
    const config = {
      port: yield* EdgeConfig.port,
      host: yield* EdgeConfig.host,
      origins: yield* EdgeConfig.allowedOrigins,
      publicUrl: yield* EdgeConfig.publicUrl,
      maxTokenBytes: yield* EdgeConfig.maxTokenBytes,
      maxPayload: yield* EdgeConfig.maxPayload,
      maxPayloadByPath: yield* EdgeConfig.maxPayloadByPath,
      pingInterval: yield* EdgeConfig.pingInterval,
      hwm: yield* EdgeConfig.outboundHighWaterMark,
      rate: yield* EdgeConfig.rateLimit,
      burst: yield* EdgeConfig.rateBurst,
      openTimeout: yield* EdgeConfig.openTimeout,
      heartbeat: yield* EdgeConfig.heartbeatInterval,
      grace: yield* EdgeConfig.shutdownGrace,
      perAddress: yield* EdgeConfig.maxConnectionsPerAddress,
      perUser: yield* EdgeConfig.maxConnectionsPerUser,
      headersTimeout: yield* EdgeConfig.headersTimeout,
      requestTimeout: yield* EdgeConfig.requestTimeout
    }
    if (Duration.greaterThan(config.headersTimeout, config.requestTimeout)) {
      return yield* Effect.dieMessage("EDGE_HEADERS_TIMEOUT must be at most EDGE_REQUEST_TIMEOUT")
    }
    const edgeId = Subjects.EdgeId(
      Option.getOrElse(yield* EdgeConfig.edgeId, () => `edge-${randomBytes(6).toString("hex")}`)
    )
    const policy = OriginPolicy.make({ allowedOrigins: config.origins, bindAddress: config.host, publicUrl: config.publicUrl })
    if (policy.anyOrigin) {
      yield* Effect.logWarning("ALLOWED_ORIGINS is *: any web page may open sockets here; set an allow-list in production")
    }

    const metrics = new EdgeMetrics()
    // Also on the process's metrics port, next to the services' metrics in the all-in-one.
    yield* Effect.acquireRelease(Effect.map(Metrics.Metrics, (registry) => registry.include(() => metrics.render())), (remove) => Effect.sync(remove))
    const boundary = yield* Boundary.make
    const turn = new Turn()
    let shuttingDown = false
    const isShuttingDown = () => shuttingDown
    /** The frame limit of a path: the upgrade picks its ws server by it, the socket I/O names it in a 1009. */
    const limitOf = (path: string) => config.maxPayloadByPath.get(routeKey(routes, path) ?? path) ?? config.maxPayload

    // --- the three parts, in the order they must be released (last built, first released) ----

    const http = yield* HttpRoutes.make({
      edgeId,
      routes,
      httpRoutes: options.httpRoutes ?? standardHttp,
      policy,
      maxTokenBytes: config.maxTokenBytes,
      openTimeout: config.openTimeout,
      metrics,
      turn,
      boundary,
      isShuttingDown,
      awaitEveryService: options.awaitEveryService === true
    })

    const sockets = yield* Sockets.make({
      edgeId,
      boundary,
      turn,
      metrics,
      limitOf,
      outboundHighWaterMark: config.hwm,
      rate: config.rate,
      burst: config.burst,
      openTimeout: config.openTimeout,
      closeGrace: config.grace,
      pingInterval: config.pingInterval
    })

    yield* Outbound.subscribe({ edgeId, sockets: sockets.outbound, http: http.deliver, logCaught: boundary.logCaught })

    // Core NATS keeps nothing for a subscriber that is away: what services sent to this edge's
    // sockets while its connection was lost is gone. Closing them tells each client to reconnect
    // and catch up as after any reconnect (an MCPx participant reads the topic's history, a proxy
    // client attaches again); a GET stream resumes from its Last-Event-ID.
    yield* bus.onReconnect(() => {
      if (shuttingDown) return
      const streams = http.endStreams()
      boundary.runFork(
        Effect.logWarning(`edge ${edgeId}: its NATS connection came back after a loss; ${streams} event streams ended, every socket closes`).pipe(
          Effect.zipRight(sockets.closeAll("resynchronising", EdgeProtocol.CloseCode.ServiceRestart, "the edge lost its connection to the bus: reconnect"))
        )
      )
    })

    const upgrade = yield* Upgrade.make({
      routes,
      policy,
      maxTokenBytes: config.maxTokenBytes,
      perAddress: config.perAddress,
      perUser: config.perUser,
      limitOf,
      isShuttingDown,
      boundary,
      open: sockets.open
    })

    const edges = yield* kv.bucket(Subjects.Bucket.edges)
    const startedAt = Date.now()
    // Suspended, so each beat reports the sockets open at that moment, not at the first.
    yield* Effect.suspend(() => edges.put(Subjects.Key.edge(edgeId), heartbeat.encode({ startedAt, connections: sockets.size() }))).pipe(
      Effect.zipRight(Effect.void),
      Effect.catchAll((e) => Effect.logWarning("edge heartbeat failed", e)),
      Effect.repeat(Schedule.spaced(config.heartbeat)),
      Effect.forkScoped
    )

    const server = yield* Effect.acquireRelease(
      Effect.async<Http.Server, Settings.StartupFailure>((resume) => {
        const headersTimeout = Duration.toMillis(config.headersTimeout)
        const server = Http.createServer({
          // A peer that sends its headers (an upgrade's too) or its body a byte at a time must
          // not hold a socket for long; Node looks for such peers every checking interval.
          headersTimeout,
          requestTimeout: Duration.toMillis(config.requestTimeout),
          connectionsCheckingInterval: Math.max(100, Math.min(1000, headersTimeout / 2))
        }, http.onRequest)
        server.on("upgrade", upgrade.onUpgrade)
        server.once("error", (e) => resume(Effect.fail(Settings.listenFailure(e, config.host, config.port))))
        server.listen(config.port, config.host, () => {
          // Once listening, an error (accept failing for want of file descriptors, say) is logged; the edge carries on.
          server.on("error", (e) => boundary.logCaught("edge: server error", e, {}))
          resume(Effect.succeed(server))
        })
      }),
      (server) =>
        Effect.gen(function*() {
          shuttingDown = true
          yield* sockets.closeAll("shutting down", EdgeProtocol.CloseCode.GoingAway, "server shutting down")
          yield* Effect.async<void>((resume) => {
            server.close(() => resume(Effect.void))
            server.closeAllConnections()
          })
          yield* edges.delete(Subjects.Key.edge(edgeId)).pipe(Effect.ignore)
        })
    )

    const address = server.address()
    const port = typeof address === "object" && address !== null ? address.port : config.port
    const url = `http://${config.host}:${port}`
    yield* Effect.logInfo(`edge ${edgeId} listening on ${url} (${Object.keys(routes).join(", ")}); ${policy.summary}`)
    return { id: edgeId, port, url, metrics, connections: () => sockets.size() } satisfies EdgeServerShape
  })

export const layer = (
  options: EdgeOptions = {}
): Layer.Layer<EdgeServer, Bus.BusError | ConfigError.ConfigError | Settings.StartupFailure, Bus.Bus | Kv.Kv | AuthClient.AuthClient | Telemetry.Tracing> =>
  Layer.scoped(EdgeServer, make(options))
