/**
 * MCP 2026-07-28 at the hub's path: requests that need no session (DESIGN.md, "Requests that need
 * no session"). The edge checks each request (`ModernRequest`), answers `server/discover` itself
 * (nothing in it depends on the user), and sends the rest to the registry's queue group, where any
 * replica answers on this edge's exchange. Closing a request's stream cancels it, towards every
 * replica. `subscriptions/listen` streams are held here: a change of a user's tools arrives once
 * on the user's subject, and every stream of that user here gets `list_changed`. Nothing is kept
 * for a stream that breaks: its client listens again.
 */
import { type Bus, Subjects } from "@switchboard/bus"
import { type Auth, Envelope, JsonRpc, Modern, ParamHeaders } from "@switchboard/protocol"
import { Telemetry } from "@switchboard/telemetry"
import { type Span, SpanKind, type Tracer } from "@opentelemetry/api"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import type * as Http from "node:http"
import { fail } from "./HttpChecks.ts"
import type * as HttpExchanges from "./HttpExchanges.ts"
import * as ModernRequest from "./ModernRequest.ts"

export interface ModernHttpOptions {
  readonly edgeId: Subjects.EdgeId
  readonly path: string
  readonly bus: Bus.BusShape
  readonly exchanges: HttpExchanges.HttpExchanges
  readonly tracer: Option.Option<Tracer>
  readonly runFork: <A, E>(effect: Effect.Effect<A, E>) => unknown
  /** Counts a message read in this turn, as a socket's frame is (see `StreamableHttpOptions.countFrame`). */
  readonly countFrame: () => void
}

export interface ModernHttp {
  /** A POST that `ModernRequest.isModern` took for the modern era, its token verified and its body parsed. */
  readonly handle: (req: Http.IncomingMessage, res: Http.ServerResponse, claims: Auth.Claims, message: Record<string, unknown>, body: Buffer) => void
  /** Ends every listen stream gracefully (its request's result, then the end); the number ended. */
  readonly endStreams: () => number
}

const DISCOVER = Modern.discoverResult(ModernRequest.Supported)
const SPAN_ATTRIBUTES = { "sb.transport": "http", "mcp.protocol.version": Modern.Versions[0] } as const
/** Proxies in between hold an SSE response back unless told not to (2026-07-28, "Receiving Messages"). */
const STREAM_HEADERS = { "x-accel-buffering": "no" } as const

const encoder = new TextEncoder()
const bytes = (text: string) => encoder.encode(text)

/**
 * The listen streams of one user on this edge, and the subscription to that user's changes once
 * there is one; until then, the acknowledgements (and responses) that wait for it.
 */
interface Listeners {
  readonly streams: Map<HttpExchanges.ExchangeId, JsonRpc.Id>
  scope: Scope.CloseableScope | undefined
  readonly waiting: Map<HttpExchanges.ExchangeId, { readonly ack: Uint8Array; readonly res: Http.ServerResponse }>
}

export const make = (options: ModernHttpOptions): ModernHttp => {
  const { bus, edgeId, exchanges, runFork, tracer } = options
  const byUser = new Map<string, Listeners>()

  const publish = (subject: string, data: string | Buffer, headers: Bus.Headers) => {
    try {
      bus.unsafePublish(subject, data, headers)
    } catch {
      // The bus is gone (shutting down): nobody is left to tell.
    }
  }

  /** The edge's span for a request, child of the host's own trace when it sent one (header or `_meta`). */
  const receiveSpan = (req: Http.IncomingMessage, message: Record<string, unknown>, method: string): { readonly span: Span; readonly traceparent: string } | undefined => {
    if (Option.isNone(tracer)) return undefined
    const header = req.headers.traceparent
    const inMeta = Modern.metaOf(message)?.["traceparent"]
    const parent = typeof header === "string" ? header : typeof inMeta === "string" ? inMeta : undefined
    return Telemetry.startSpan(tracer.value, "edge.receive", parent, {
      kind: SpanKind.CONSUMER,
      attributes: { ...SPAN_ATTRIBUTES, "rpc.method": method, "sb.edge": edgeId, "sb.path": options.path }
    })
  }

  const answer = (res: Http.ServerResponse, id: JsonRpc.Id, result: unknown) => {
    const body = JSON.stringify({ jsonrpc: "2.0", id, result })
    res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) }).end(body)
  }

  /** To the registry's queue group; the answer comes back to the exchange, and a client's close cancels it everywhere. */
  const forward = (req: Http.IncomingMessage, res: Http.ServerResponse, claims: Auth.Claims, message: Record<string, unknown>, body: Buffer, request: ModernRequest.Accepted) => {
    options.countFrame()
    const user = claims.sub
    const traced = receiveSpan(req, message, request.method)
    const tellCancelled = (n: HttpExchanges.ExchangeId) =>
      publish(Subjects.statelessCancelled("registry"), "", Envelope.encodeStateless({ user, edge: edgeId, http: n }))
    const n = exchanges.post({
      res,
      key: `${user} ${String(request.id)}`,
      user,
      id: request.id,
      headers: STREAM_HEADERS,
      about: { user, request: String(request.id), method: request.method },
      // "Closing the SSE response stream MUST be treated by the server as cancellation of that
      // request" (2026-07-28): a client's close and the edge's cut alike.
      onCut: tellCancelled,
      onClosed: tellCancelled
    })
    // Only the replica knows which arguments the tool mirrors into Mcp-Param-* headers: it checks them.
    const params = request.method === "tools/call" ? ParamHeaders.encodeReceived(req.headers) : undefined
    publish(Subjects.stateless("registry"), body, Envelope.encodeStateless({ user, edge: edgeId, http: n, params, traceparent: traced?.traceparent }))
    traced?.span.end()
  }

  // --- subscriptions/listen ------------------------------------------------------------------

  const listChanged = (id: JsonRpc.Id) =>
    bytes(JSON.stringify({ jsonrpc: "2.0", method: "notifications/tools/list_changed", params: { _meta: { [Modern.Meta.subscriptionId]: id } } }))

  const changed = (user: string) => () => {
    const listeners = byUser.get(user)
    if (listeners === undefined) return
    for (const [n, id] of listeners.streams) exchanges.deliver(n, { data: listChanged(id), end: false })
  }

  const stopListening = (user: string, n: HttpExchanges.ExchangeId) => {
    const listeners = byUser.get(user)
    if (listeners === undefined) return
    listeners.waiting.delete(n)
    if (!listeners.streams.delete(n) || listeners.streams.size > 0) return
    byUser.delete(user)
    const scope = listeners.scope
    if (scope !== undefined) runFork(Scope.close(scope, Exit.void))
  }

  /**
   * A listen stream: its 200 and acknowledgement wait until this edge hears the user's changes (a
   * subscription the server has seen), so that no change after the client has its acknowledgement
   * is missed. The first stream of a user here subscribes; the last one to go lets go.
   */
  const listen = (res: Http.ServerResponse, claims: Auth.Claims, id: JsonRpc.Id, message: Record<string, unknown>) => {
    const params = message["params"]
    const filter = JsonRpc.isRecord(params) ? params["notifications"] : undefined
    if (filter !== undefined && !JsonRpc.isRecord(filter)) {
      return fail(res, 400, JsonRpc.ErrorCode.InvalidParams, "Invalid params: notifications must be an object such as {\"toolsListChanged\": true}")
    }
    const tools = filter?.["toolsListChanged"] === true
    const user = claims.sub
    const ack = bytes(JSON.stringify({
      jsonrpc: "2.0",
      method: "notifications/subscriptions/acknowledged",
      // Only what this hub can honor: its tools' list.
      params: { _meta: { [Modern.Meta.subscriptionId]: id }, notifications: tools ? { toolsListChanged: true } : {} }
    }))
    const n = exchanges.stream({
      res,
      key: `${user} listen ${String(id)}`,
      user,
      headers: STREAM_HEADERS,
      about: { user, request: String(id), method: "subscriptions/listen" },
      primes: false,
      onCut: (n) => stopListening(user, n),
      onClosed: (n) => stopListening(user, n)
    })
    if (!tools) return exchanges.deliver(n, { data: ack, end: false })
    const existing = byUser.get(user)
    if (existing !== undefined) {
      existing.streams.set(n, id)
      if (existing.scope !== undefined) return exchanges.deliver(n, { data: ack, end: false })
      return void existing.waiting.set(n, { ack, res })
    }
    const listeners: Listeners = { streams: new Map([[n, id]]), scope: undefined, waiting: new Map([[n, { ack, res }]]) }
    byUser.set(user, listeners)
    runFork(
      Effect.gen(function*() {
        const scope = yield* Scope.make()
        yield* Scope.extend(bus.subscribe(Subjects.toolsChanged(user), changed(user)), scope)
        yield* bus.flush
        // Every stream of the user closed meanwhile.
        if (byUser.get(user) !== listeners) return yield* Scope.close(scope, Exit.void)
        listeners.scope = scope
        for (const [waiting, { ack }] of listeners.waiting) exchanges.deliver(waiting, { data: ack, end: false })
        listeners.waiting.clear()
      }).pipe(
        Effect.catchAllCause(() =>
          Effect.sync(() => {
            // Without the subscription no change could reach these streams: they are refused, and their clients listen again.
            if (byUser.get(user) === listeners) byUser.delete(user)
            for (const { res } of listeners.waiting.values()) fail(res, 503, JsonRpc.ErrorCode.ServerError, "could not listen for this user's changes; listen again")
            listeners.waiting.clear()
          })
        )
      )
    )
  }

  const handle: ModernHttp["handle"] = (req, res, claims, message, body) => {
    const verdict = ModernRequest.check(req.headers, message)
    switch (verdict.kind) {
      case "refused":
        return refuse(res, verdict)
      case "notification":
        return void res.writeHead(202).end()
    }
    switch (verdict.method) {
      case "server/discover":
        return answer(res, verdict.id, DISCOVER)
      case "subscriptions/listen":
        return listen(res, claims, verdict.id, message)
      default:
        return forward(req, res, claims, message, body, verdict)
    }
  }

  const refuse = (res: Http.ServerResponse, refused: ModernRequest.Refused) => {
    const error = { code: refused.code, message: refused.message, ...(refused.data === undefined ? {} : { data: refused.data }) }
    const body = JSON.stringify({ jsonrpc: "2.0", id: refused.id, error })
    res.writeHead(refused.status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) }).end(body)
  }

  const endStreams = () => {
    let ended = 0
    for (const listeners of [...byUser.values()]) {
      for (const [n, id] of [...listeners.streams]) {
        // "it SHOULD respond to the original subscriptions/listen request with a completion result before closing the stream"
        const done = JSON.stringify({ jsonrpc: "2.0", id, result: { resultType: "complete", _meta: { [Modern.Meta.subscriptionId]: id } } })
        exchanges.deliver(n, { data: bytes(done), end: true })
        ended++
      }
    }
    return ended
  }

  return { handle, endStreams }
}
