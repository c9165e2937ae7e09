/**
 * The edge's plain HTTP: liveness, readiness and metrics; requests a service answers over the bus
 * (`/v0/topics`, `/admin/`); the `/embed` page; Streamable HTTP at the hub's path; and 426 at a
 * path that speaks only WebSocket. Every answer is plain text or JSON, and a bug in one request
 * costs that request only.
 */
import type { AuthClient } from "@switchboard/auth"
import { Bus, Kv, Peer, Subjects } from "@switchboard/bus"
import { Edge as EdgeProtocol, type Envelope } from "@switchboard/protocol"
import type { Telemetry } from "@switchboard/telemetry"
import * as Cause from "effect/Cause"
import type * as ConfigError from "effect/ConfigError"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import type * as Http from "node:http"
import type { Boundary } from "./Boundary.ts"
import * as Embed from "./Embed.ts"
import type { EdgeMetrics } from "./Metrics.ts"
import type { OriginPolicy } from "./OriginPolicy.ts"
import { headerToken, requestLog, targetOf, tokenTooLong } from "./Requests.ts"
import { type HttpRouteTable, routeKey, type RouteTable } from "./Routes.ts"
import * as StreamableHttp from "./StreamableHttp.ts"
import type { Turn } from "./Turn.ts"

export interface HttpRoutesOptions {
  readonly edgeId: Subjects.EdgeId
  /** The WebSocket routes: their paths answer 426, their services make readiness, `/hub` is Streamable HTTP too. */
  readonly routes: RouteTable
  /** Path prefixes a service answers over the bus. */
  readonly httpRoutes: HttpRouteTable
  /** Which Host names every request must use, and which Origins may reach `/hub` (shared with the upgrade). */
  readonly policy: OriginPolicy
  /** The longest bearer token forwarded or verified; a longer one is refused 401 here. */
  readonly maxTokenBytes: number
  readonly openTimeout: Duration.DurationInput
  readonly metrics: EdgeMetrics
  readonly turn: Turn
  readonly boundary: Boundary
  /** While true, readiness answers 503. */
  readonly isShuttingDown: () => boolean
  /**
   * Whether readiness waits for every service behind the edge, not just one. The all-in-one sets
   * it: its services start with its edge, and an upgrade to one not running yet would get 1013. A
   * distributed edge leaves it off: there a missing service is an outage elsewhere, and the edge
   * still serves the others.
   */
  readonly awaitEveryService?: boolean
}

export interface HttpRoutes {
  /** The HTTP server's `request` listener. */
  readonly onRequest: (req: Http.IncomingMessage, res: Http.ServerResponse) => void
  /** Delivers to one of this edge's Streamable HTTP exchanges; undefined when no route serves `/hub`. */
  readonly deliver: ((delivery: Envelope.Exchange, data: Uint8Array) => void) | undefined
  /** Ends the Streamable HTTP GET streams open here (see `StreamableHttpShape.endStreams`). */
  readonly endStreams: () => number
}

/** Largest HTTP request body the edge forwards to a service. */
const MAX_HTTP_BODY = 64 * 1024

/** How the edge asks a service to answer a plain HTTP request. */
const httpPeers = Peer.protocol(EdgeProtocol.ServiceHttp)

type Reply = (status: number, body: string, type?: string, headers?: Readonly<Record<string, string>>) => void

export const make = (
  options: HttpRoutesOptions
): Effect.Effect<HttpRoutes, Bus.BusError | ConfigError.ConfigError, Bus.Bus | Kv.Kv | AuthClient.AuthClient | Telemetry.Tracing | Scope.Scope> =>
  Effect.gen(function*() {
    const bus = yield* Bus.Bus
    const kv = yield* Kv.Kv
    const { routes, metrics, isShuttingDown } = options
    const { runFork, logCaught } = options.boundary
    const httpRoutes = Object.entries(options.httpRoutes)

    // Plain HTTP at the hub's path is Streamable HTTP: the same sessions, without a socket.
    const hub = routes["/hub"]
    const streamable = hub === undefined
      ? undefined
      : yield* StreamableHttp.make({
        edgeId: options.edgeId,
        path: "/hub",
        service: hub.service,
        policy: options.policy,
        maxTokenBytes: options.maxTokenBytes,
        openTimeout: options.openTimeout,
        runFork,
        logCaught,
        countFrame: options.turn.count,
        metrics
      })

    const embed = yield* Embed.make

    // --- readiness: an edge none of whose services runs would refuse every upgrade -----------

    const served = [...new Set(Object.values(routes).map((r) => r.service))]
    const replicas = yield* kv.bucket(Subjects.Bucket.replicas)
    /** Probes come every few seconds from each kubelet: one look at the replica keys per second is plenty. */
    let lastLook: { readonly at: number; readonly absent: ReadonlyArray<Subjects.ServiceName> } | undefined
    const absentServices = Effect.suspend(() =>
      lastLook !== undefined && Date.now() - lastLook.at < 1000
        ? Effect.succeed(lastLook.absent)
        : Effect.filter(served, (service) =>
          Effect.map(replicas.keys(Subjects.Key.replicas(service)), (keys) => keys.length === 0).pipe(Effect.orElseSucceed(() => true))
        ).pipe(Effect.tap((absent) => Effect.sync(() => (lastLook = { at: Date.now(), absent }))))
    )

    // --- requests a service answers ----------------------------------------------------------

    /** Logs the request a bug hit, and answers it 500 (or cuts a response already begun). */
    const requestFailed = (req: Http.IncomingMessage, reply: Reply, what: string, cause: unknown) => {
      logCaught(what, cause, requestLog(req))
      try {
        reply(500, "internal error\n")
      } catch {
        req.socket.destroy()
      }
    }

    const guarded = (req: Http.IncomingMessage, reply: Reply, handle: () => void) => {
      try {
        handle()
      } catch (cause) {
        requestFailed(req, reply, "edge: request handler threw", cause)
      }
    }

    /** Hands a plain HTTP request to the service that answers its path, over the bus. */
    const forwardHttp = (req: Http.IncomingMessage, url: URL, service: Subjects.ServiceName, reply: Reply) => {
      // Refused before its body is read, and never sent to the service to verify.
      const token = headerToken(req)
      const tooLong = token === undefined ? undefined : tokenTooLong(token, options.maxTokenBytes)
      if (tooLong !== undefined) {
        return reply(401, JSON.stringify({ error: `invalid token: ${tooLong}` }), "application/json", {
          "www-authenticate": `Bearer error="invalid_token"`,
          connection: "close"
        })
      }
      const chunks: Array<Buffer> = []
      let size = 0
      req.on("data", (chunk: Buffer) => {
        size += chunk.byteLength
        if (size > MAX_HTTP_BODY) {
          reply(413, "request body too large\n")
          req.destroy()
        } else chunks.push(chunk)
      })
      req.on("end", () => {
        guarded(req, reply, () => {
          const request = new EdgeProtocol.HttpForward({
            method: req.method ?? "GET",
            path: url.pathname,
            query: Object.fromEntries(url.searchParams),
            body: Buffer.concat(chunks).toString("utf8"),
            base: options.policy.baseUrl(req.headers.host),
            ...(req.headers.authorization === undefined ? {} : { authorization: req.headers.authorization })
          })
          runFork(
            httpPeers.callOn(bus, Subjects.http(service), request, { timeout: "10 seconds" }).pipe(
              Effect.match({
                onFailure: (e) =>
                  e._tag === "PeerUnavailable" && e.reason === "NoResponders"
                    ? reply(503, `${service} service unavailable\n`)
                    : e._tag === "PeerTimeout"
                    ? reply(504, `${service} service did not answer\n`)
                    : reply(502, "bad answer from the service\n"),
                onSuccess: (r) => reply(r.status, JSON.stringify(r.body), "application/json", r.retryAfter === undefined ? {} : { "retry-after": String(r.retryAfter) })
              }),
              // An answer that cannot be written (a status Node refuses, say) is the service's bug;
              // the client still gets an answer.
              Effect.catchAllCause((cause) =>
                Effect.sync(() => requestFailed(req, reply, "edge: answering a forwarded request failed", Cause.squash(cause)))
              )
            )
          )
        })
      })
    }

    const onRequest = (req: Http.IncomingMessage, res: Http.ServerResponse) => {
      const reply: Reply = (status, body, type = "text/plain; charset=utf-8", headers = {}) => {
        if (res.headersSent) return void res.destroy()
        res.writeHead(status, { ...headers, "content-type": type, "content-length": Buffer.byteLength(body) })
        res.end(body)
      }
      guarded(req, reply, () => {
        const url = targetOf(req)
        if (url === undefined) return reply(400, "malformed request target\n")
        const path = url.pathname
        const probe = req.method === "GET" && (path === "/healthz" || path === "/readyz" || path === "/metrics")
        const misdirected = options.policy.checkHost(req.headers.host, probe)
        if (misdirected !== undefined) return reply(misdirected.status, `${misdirected.message}\n`)
        if (req.method === "GET" && path === "/healthz") return reply(200, "ok\n")
        if (req.method === "GET" && path === "/readyz") {
          if (isShuttingDown()) return reply(503, "shutting down\n")
          if (!bus.isConnected()) return reply(503, "bus disconnected\n")
          return void runFork(Effect.map(absentServices, (absent) => {
            if (absent.length === 0) return reply(200, "ready\n")
            const what = `no live replica of ${absent.join(", ")}`
            return absent.length === served.length
              ? reply(503, `not ready: ${what}, so every upgrade would be refused\n`)
              : options.awaitEveryService === true
              ? reply(503, `not ready: ${what} yet\n`)
              : reply(200, `ready, but ${what}\n`)
          }))
        }
        if (req.method === "GET" && path === "/metrics") return reply(200, metrics.render(), "text/plain; version=0.0.4")
        const routed = httpRoutes.find(([prefix]) => path.startsWith(prefix))
        if (routed !== undefined) return forwardHttp(req, url, routed[1], reply)
        if (streamable?.serves(path) === true) return streamable.handle(req, res, url)
        if (embed.serves(path)) return embed.handle(req, res, path)
        if (routeKey(routes, path) !== undefined) return reply(426, "this endpoint speaks WebSocket\n")
        reply(404, "not found\n")
      })
    }

    return { onRequest, deliver: streamable?.deliver, endStreams: () => streamable?.endStreams() ?? 0 } satisfies HttpRoutes
  })
