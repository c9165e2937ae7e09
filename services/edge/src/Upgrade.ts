/**
 * The WebSocket upgrade: which path, from which Origin and Host, with which token, within which limits. A
 * request refused here gets a plain HTTP error before any service sees it; one accepted is
 * handshaken and handed to the socket I/O (`open`), which owns it from then on.
 */
import { AuthClient } from "@switchboard/auth"
import { ConnectionLimit } from "@switchboard/bus"
import type { Auth } from "@switchboard/protocol"
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as Http from "node:http"
import type { Duplex } from "node:stream"
import { type Server, WebSocketServer } from "ws"
import type { Boundary } from "./Boundary.ts"
import { EdgeWebSocket } from "./EdgeSocket.ts"
import type { OriginPolicy } from "./OriginPolicy.ts"
import { headerToken, requestLog, type SocketTarget, socketTarget, targetOf, tokenTooLong } from "./Requests.ts"
import { type Route, routeKey, type RouteTable } from "./Routes.ts"

export interface UpgradeOptions {
  readonly routes: RouteTable
  /** Which Origins and Host names may open sockets (shared with the HTTP routes). */
  readonly policy: OriginPolicy
  /** The longest bearer token taken; a longer one is refused 401 without being verified. */
  readonly maxTokenBytes: number
  /** Sockets at once per remote address, and per user (0: none). */
  readonly perAddress: number
  readonly perUser: number
  /** The largest frame a path takes. */
  readonly limitOf: (path: string) => number
  /** While true, every upgrade is refused 503. */
  readonly isShuttingDown: () => boolean
  readonly boundary: Boundary
  /** Takes a socket past its handshake: from here it is the socket I/O's. */
  readonly open: (req: Http.IncomingMessage, raw: Duplex, ws: EdgeWebSocket, target: SocketTarget, route: Route, claims: Auth.Claims | undefined) => void
}

export interface Upgrade {
  /** The HTTP server's `upgrade` listener. */
  readonly onUpgrade: (req: Http.IncomingMessage, socket: Duplex, head: Buffer) => void
}

/** How long a refused upgrade's socket may wait for the peer to close its side before it is destroyed. */
const REFUSED_LINGER_MS = 2000

/**
 * Answers an upgrade request with a plain HTTP error and closes the TCP socket, at once if the
 * peer does not close its side soon: a refused socket must not linger, holding its slot.
 */
const refuseUpgrade = (socket: Duplex, status: number, message: string) => {
  if (!socket.writable) return socket.destroy()
  const body = `${message}\n`
  socket.end(
    `HTTP/1.1 ${status} ${Http.STATUS_CODES[status] ?? "Error"}\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
  )
  setTimeout(() => socket.destroy(), REFUSED_LINGER_MS).unref()
}

/**
 * A socket's error ends it. One function for every socket, called with the socket as `this`: a
 * closure per socket, and its context, stayed for the socket's whole life (issue 29).
 */
function destroyOnError(this: Duplex) {
  this.destroy()
}

/** The slots a socket holds, kept on it for the close listener that gives them back. */
const addressSlot = Symbol("edge.addressSlot")
const userSlot = Symbol("edge.userSlot")
type Slotted = Duplex & { [addressSlot]?: string; [userSlot]?: string }

/** A browser's WebSocket cannot set headers, so a socket's token may come in the query too. */
const bearer = (req: Http.IncomingMessage, url: URL): string | undefined => headerToken(req) ?? url.searchParams.get("token") ?? undefined

export const make = (options: UpgradeOptions): Effect.Effect<Upgrade, never, AuthClient.AuthClient> =>
  Effect.gen(function*() {
    const auth = yield* AuthClient.AuthClient
    const { routes, policy, isShuttingDown, limitOf } = options
    const { runFork, logCaught } = options.boundary
    const byAddress = new ConnectionLimit(options.perAddress)
    const byUser = new ConnectionLimit(options.perUser)
    const counted = options.perAddress > 0 || options.perUser > 0

    /**
     * Gives back a socket's slots when it closes: one listener for every socket, which reads them
     * off it. A closure per slot, and the array of close listeners that two more made, stayed for
     * the socket's whole life (issue 29). A socket closes once.
     */
    function releaseSlots(this: Slotted) {
      const address = this[addressSlot]
      const user = this[userSlot]
      if (address !== undefined) byAddress.give(address)
      if (user !== undefined) byUser.give(user)
    }

    /** An upgrade answered with an HTTP error, in the access log as the upgrades it refuses are. */
    const refuse = (req: Http.IncomingMessage, socket: Duplex, status: number, message: string) => {
      runFork(Effect.logInfo(`edge: refused an upgrade with ${status}: ${message}`).pipe(Effect.annotateLogs(requestLog(req))))
      refuseUpgrade(socket, status, message)
    }

    /** One ws server per frame limit: ws takes `maxPayload` per server. */
    const servers = new Map<number, Server<typeof EdgeWebSocket>>()
    const serverFor = (limit: number) => {
      let wss = servers.get(limit)
      if (wss === undefined) {
        wss = new WebSocketServer<typeof EdgeWebSocket>({
          WebSocket: EdgeWebSocket,
          noServer: true,
          maxPayload: limit,
          perMessageDeflate: false,
          clientTracking: false,
          handleProtocols: (offered, req) => {
            const target = targetOf(req)
            const key = target === undefined ? undefined : routeKey(routes, target.pathname)
            const route = key === undefined ? undefined : routes[key]
            return route?.subprotocol !== undefined && offered.has(route.subprotocol) ? route.subprotocol : false
          }
        })
        servers.set(limit, wss)
      }
      return wss
    }

    const accept = (req: Http.IncomingMessage, socket: Duplex, head: Buffer, target: SocketTarget, route: Route, claims: Auth.Claims | undefined) =>
      serverFor(limitOf(target.path)).handleUpgrade(req, socket, head, (ws) => {
        try {
          options.open(req, socket, ws, target, route, claims)
        } catch (cause) {
          // Past the handshake: the peer reads WebSocket frames now, not an HTTP error.
          logCaught("edge: opening a socket threw", cause, requestLog(req))
          ws.terminate()
        }
      })

    /**
     * Takes the user's slot once the token is verified, and upgrades. The peer may have gone while
     * the token was checked: a destroyed socket never emits `close` again, and its slot would stay.
     */
    const acceptVerified = (req: Http.IncomingMessage, socket: Slotted, head: Buffer, target: SocketTarget, route: Route, claims: Auth.Claims) => {
      if (socket.destroyed) return
      if (isShuttingDown()) return refuse(req, socket, 503, "shutting down")
      if (!byUser.tryTake(claims.sub)) {
        return refuse(req, socket, 429, `too many connections for user ${claims.sub} (at most ${options.perUser})`)
      }
      if (counted) socket[userSlot] = claims.sub
      accept(req, socket, head, target, route, claims)
    }

    const upgrade = (req: Http.IncomingMessage, socket: Slotted, head: Buffer) => {
      if (isShuttingDown()) return refuse(req, socket, 503, "shutting down")
      const url = targetOf(req)
      if (url === undefined) return refuse(req, socket, 400, "malformed request target")
      const key = routeKey(routes, url.pathname)
      const route = key === undefined ? undefined : routes[key]
      if (route === undefined) return refuse(req, socket, 404, `no WebSocket endpoint at ${url.pathname}`)
      const refused = policy.checkHost(req.headers.host, false) ?? policy.checkOrigin(req.headers.origin)
      if (refused !== undefined) return refuse(req, socket, refused.status, refused.message)
      // The slot is the TCP socket's, from here to its close, whatever happens in between (a
      // refused token, a handshake ws rejects, a socket that lives for days).
      const address = req.socket.remoteAddress ?? "unknown"
      if (!byAddress.tryTake(address)) {
        return refuse(req, socket, 429, `too many connections from ${address} (at most ${options.perAddress})`)
      }
      if (counted) {
        socket[addressSlot] = address
        socket.on("close", releaseSlots)
      }
      const token = bearer(req, url)
      const target = socketTarget(url)
      if (token === undefined) {
        if (route.auth === "upgrade") return refuse(req, socket, 401, "a bearer token is required (Authorization header or ?token=)")
        return accept(req, socket, head, target, route, undefined)
      }
      const tooLong = tokenTooLong(token, options.maxTokenBytes)
      if (tooLong !== undefined) return refuse(req, socket, 401, `invalid token: ${tooLong}`)
      // A callback, not a fiber: a fiber per upgrade waiting for the auth service outlived a
      // scavenge and was old-generation garbage of every handshake (issue 29).
      auth.unsafeVerify(token, (verdict) => {
        try {
          if (Exit.isSuccess(verdict)) return acceptVerified(req, socket, head, target, route, verdict.value)
          const failure = Cause.failureOption(verdict.cause)
          if (Option.isSome(failure)) {
            const e = failure.value
            return refuse(req, socket, e._tag === "AuthFailed" ? 401 : 503, e._tag === "AuthFailed" ? `invalid token: ${e.reason}` : e.reason)
          }
          logCaught("edge: upgrade failed after the token check", Cause.squash(verdict.cause), requestLog(req))
        } catch (cause) {
          logCaught("edge: upgrade failed after the token check", cause, requestLog(req))
        }
        refuse(req, socket, 500, "internal error")
      })
    }

    const onUpgrade = (req: Http.IncomingMessage, socket: Duplex, head: Buffer) => {
      socket.on("error", destroyOnError)
      try {
        upgrade(req, socket, head)
      } catch (cause) {
        logCaught("edge: upgrade handler threw", cause, requestLog(req))
        // `open` catches its own: what reaches here threw before the handshake, so the peer still reads HTTP.
        refuse(req, socket, 500, "internal error")
      }
    }

    return { onUpgrade } satisfies Upgrade
  })
