/**
 * The upgrade alone, with the real auth client and service on the embedded bus: every refusal
 * answers with its HTTP status and a message that says why, before any socket exists; an accepted
 * upgrade reaches `open` with the route, the verified claims and the chosen subprotocol.
 */
import { describe, expect, it } from "@effect/vitest"
import { AuthClient, AuthService, Tokens } from "@switchboard/auth"
import { MemoryBus } from "@switchboard/bus"
import type { Auth } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import type { WebSocket } from "ws"
import * as Boundary from "../src/Boundary.ts"
import * as OriginPolicy from "../src/OriginPolicy.ts"
import type { Route, RouteTable } from "../src/Routes.ts"
import * as Upgrade from "../src/Upgrade.ts"
import { connect, eventually, listen, rawStatus, refusal, settings } from "./support.ts"

const routes: RouteTable = {
  "/open": { service: "router", auth: "in-band", traceInbound: false },
  "/private": { service: "broker", auth: "upgrade", traceInbound: true },
  "/hub": { service: "registry", auth: "optional", subprotocol: "mcp", traceInbound: true }
}

/** Auth as deployed: the client asks the auth service over the (embedded) bus. */
const withAuth = AuthClient.layer.pipe(
  Layer.provideMerge(AuthService.layer),
  Layer.provideMerge(Tokens.layer),
  Layer.provideMerge(MemoryBus.layer),
  Layer.provide(settings())
)

/** The client without an auth service behind it. */
const authDown = AuthClient.layer.pipe(Layer.provideMerge(MemoryBus.layer), Layer.provide(settings()))

interface Opened {
  readonly path: string
  readonly query: Readonly<Record<string, string>>
  readonly route: Route
  readonly claims: Auth.Claims | undefined
  readonly protocol: string
  readonly ws: WebSocket
}

/** The upgrade on a server of its own; `open` records what the socket I/O would be handed. */
const serve = (options: Partial<Upgrade.UpgradeOptions> = {}) =>
  Effect.gen(function*() {
    const opened = yield* Queue.unbounded<Opened>()
    let shuttingDown = false
    const upgrade = yield* Upgrade.make({
      routes,
      policy: OriginPolicy.make({ allowedOrigins: Option.some(["https://app.example"]), bindAddress: "127.0.0.1", publicUrl: Option.none() }),
      maxTokenBytes: 8192,
      perAddress: 100,
      perUser: 100,
      limitOf: () => 1024,
      isShuttingDown: () => shuttingDown,
      boundary: yield* Boundary.make,
      open: (_req, _raw, ws, target, route, claims) => void Queue.unsafeOffer(opened, { path: target.path, query: target.query, route, claims, protocol: ws.protocol, ws }),
      ...options
    })
    const server = yield* listen({ onUpgrade: upgrade.onUpgrade })
    return { ...server, opened, shutDown: () => (shuttingDown = true) }
  })

const tokenFor = (sub: string) => Effect.flatMap(Tokens.Tokens, (t) => t.issue({ sub })).pipe(Effect.orDie)

describe("the edge's upgrade", () => {
  it.scopedLive("refuses with the status and message of each check, and opens nothing", () =>
    Effect.gen(function*() {
      const edge = yield* serve()
      expect(yield* refusal(connect(`${edge.ws}/nowhere`))).toEqual({ status: 404, body: "no WebSocket endpoint at /nowhere" })
      expect(yield* refusal(connect(`${edge.ws}/open`, { origin: "https://evil.example" }))).toEqual({
        status: 403,
        body: "origin https://evil.example is not allowed"
      })
      expect(yield* refusal(connect(`${edge.ws}/private`))).toEqual({
        status: 401,
        body: "a bearer token is required (Authorization header or ?token=)"
      })
      const bad = yield* refusal(connect(`${edge.ws}/hub?token=not-a-jwt`))
      expect(bad).toMatchObject({ status: 401 })
      expect(typeof bad === "object" && bad.body.startsWith("invalid token: ")).toBe(true)
      const upgradeHeaders = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
      expect(yield* rawStatus(edge.port, `GET // HTTP/1.1\r\nHost: x\r\n${upgradeHeaders}\r\n`)).toBe(400)
      edge.shutDown()
      expect(yield* refusal(connect(`${edge.ws}/open`))).toEqual({ status: 503, body: "shutting down" })
      expect(yield* Queue.size(edge.opened)).toBe(0)
    }).pipe(Effect.provide(withAuth)))

  it.scopedLive("hands an accepted socket to open with its route, its verified claims and the subprotocol it offered", () =>
    Effect.gen(function*() {
      const edge = yield* serve()
      const token = yield* tokenFor("alice")
      yield* connect(`${edge.ws}/private`, { headers: { authorization: `Bearer ${token}` }, origin: "https://app.example" })
      const priv = yield* Queue.take(edge.opened)
      expect(priv.path).toBe("/private")
      expect(priv.route.service).toBe("broker")
      expect(priv.claims?.sub).toBe("alice")
      // A query token counts as the header does, and is the one parameter the open leaves out; the
      // route's subprotocol is chosen when offered.
      yield* connect(`${edge.ws}/hub?a=1&token=${token}&b=x%20y&a=2`, { protocols: ["mcp"] })
      const hub = yield* Queue.take(edge.opened)
      expect([hub.path, hub.query, hub.claims?.sub, hub.protocol]).toEqual(["/hub", { a: "2", b: "x y" }, "alice", "mcp"])
      // In-band routes take sockets without a token: the protocol authenticates later.
      yield* connect(`${edge.ws}/open`)
      const open = yield* Queue.take(edge.opened)
      expect([open.path, open.claims, open.protocol]).toEqual(["/open", undefined, ""])
    }).pipe(Effect.provide(withAuth)))

  it.scopedLive("holds one slot per TCP socket per address and per user, and frees it when the socket closes", () =>
    Effect.gen(function*() {
      const edge = yield* serve({ perAddress: 2, perUser: 1 })
      const alice = yield* tokenFor("alice")
      const bob = yield* tokenFor("bob")
      yield* connect(`${edge.ws}/private?token=${alice}`)
      const first = yield* Queue.take(edge.opened)
      expect(yield* refusal(connect(`${edge.ws}/private?token=${alice}`))).toEqual({ status: 429, body: "too many connections for user alice (at most 1)" })
      yield* connect(`${edge.ws}/private?token=${bob}`)
      yield* Queue.take(edge.opened)
      expect(yield* refusal(connect(`${edge.ws}/open`))).toEqual({ status: 429, body: "too many connections from 127.0.0.1 (at most 2)" })
      // The edge frees alice's slots when the TCP socket closes, a moment after the client's close.
      first.ws.terminate()
      yield* eventually(connect(`${edge.ws}/private?token=${alice}`))
      expect((yield* Queue.take(edge.opened)).claims?.sub).toBe("alice")
    }).pipe(Effect.provide(withAuth)))

  it.scopedLive("refuses 503 with the reason when no auth service can check the token", () =>
    Effect.gen(function*() {
      const edge = yield* serve()
      const answer = yield* refusal(connect(`${edge.ws}/private?token=whatever`))
      expect(answer).toEqual({ status: 503, body: "auth service unavailable (NoResponders)" })
      expect(yield* Queue.size(edge.opened)).toBe(0)
    }).pipe(Effect.provide(authDown)))
})
