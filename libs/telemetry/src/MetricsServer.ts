/**
 * The small HTTP port every Switchboard process serves for Prometheus: `GET /metrics` (text format
 * 0.0.4, the process's whole registry) and `GET /healthz`. Services other than the edge have no
 * HTTP port of their own; this is it. The all-in-one serves one, with every service in it.
 */
import { Settings } from "@switchboard/protocol"
import * as Config from "effect/Config"
import type * as ConfigError from "effect/ConfigError"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { Metrics } from "./Metrics.ts"

export const port = Settings.intBetween("METRICS_PORT", 0, 65535, 9464, "Port of /metrics and /healthz; 0 picks a free one (logged)")
/** The edge's `HOST`: in a container (`HOST=0.0.0.0`) the scraper must reach this port too. */
export const host = Config.string("HOST").pipe(Config.withDescription("Address to bind"), Config.withDefault("127.0.0.1"))

/** Serves the registry until the scope closes; returns where, for logs and tests. */
export const make = Effect.gen(function*() {
  const registry = yield* Metrics
  const config = { port: yield* port, host: yield* host }
  const server = yield* Effect.acquireRelease(
    Effect.async<Http.Server, Settings.StartupFailure>((resume) => {
      const server = Http.createServer((req, res) => {
        const reply = (status: number, body: string, type = "text/plain; charset=utf-8") => {
          res.writeHead(status, { "content-type": type, "content-length": Buffer.byteLength(body) })
          res.end(body)
        }
        const path = (req.url ?? "").split("?")[0]
        if (req.method !== "GET") return reply(405, "only GET\n")
        if (path === "/metrics") return reply(200, registry.render(), "text/plain; version=0.0.4; charset=utf-8")
        if (path === "/healthz") return reply(200, "ok\n")
        reply(404, "not found\n")
      })
      server.once("error", (e) => resume(Effect.fail(Settings.listenFailure(e, config.host, config.port, "METRICS_PORT"))))
      server.listen(config.port, config.host, () => {
        // Once listening, a failing scrape connection is the scraper's problem, not the process's.
        server.removeAllListeners("error")
        server.on("error", () => {})
        resume(Effect.succeed(server))
      })
    }),
    (server) =>
      Effect.async<void>((resume) => {
        server.close(() => resume(Effect.void))
        server.closeAllConnections()
      })
  )
  const bound = (server.address() as AddressInfo).port
  const url = `http://${config.host.includes(":") ? `[${config.host}]` : config.host}:${bound}`
  yield* Effect.logInfo(`metrics on ${url}/metrics`)
  return { port: bound, url }
})

export const layer: Layer.Layer<never, Settings.StartupFailure | ConfigError.ConfigError> = Layer.scopedDiscard(make)
