/**
 * Two router replicas on a real NATS: the MCP client's actor on replica C, its extension's actor
 * on replica E. C reaches NATS through a relay the test cuts and restores, so peer messages sent
 * to C meanwhile are lost for certain (core NATS keeps nothing for a subscriber that is away), as
 * when C's NATS node dies and it reconnects to another. The extension closing in that gap loses
 * its `ExtensionGone`; when C's connection is back, the client's actor asks E's (`Proxy.Probe`)
 * and ends its session. A healthy session is asked too, and left alone, even when the answer is
 * slow in coming. The other way round, E cut off loses a client's `Detach`, and asks the client's
 * actor once it is back.
 */
import { expect, layer } from "@effect/vitest"
import { AuthClient, AuthService, Tokens } from "@switchboard/auth"
import { Bus, NatsBus, Peer, type Subjects } from "@switchboard/bus"
import { Proxy } from "@switchboard/protocol"
import { Telemetry } from "@switchboard/telemetry"
import { NatsServer } from "@switchboard/testing"
import type * as ActorClient from "@switchboard/testing/ActorClient"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import * as Router from "../src/Router.ts"
import { call, extension, mcpClient, next, nextBut } from "./Harness.ts"
import * as Relay from "./Relay.ts"

const SECRET = "router-relay-secret-that-is-long-enough-for-hs256"
const ENV = {
  SWITCHBOARD_JWT_SECRET: SECRET,
  ROUTER_SHUTDOWN_GRACE: "1 second",
  ROUTER_STATUS_INTERVAL: "1 hour",
  ROUTER_REQUEST_TIMEOUT: "1 second",
  ROUTER_PROBE_TIMEOUT: "1 second"
}
const config = Layer.setConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(ENV))))
const routerPeers = Peer.protocol(Proxy.RouterPeer)

let counter = 0
const namespace = () => `r${process.pid}n${counter++}`

/** A router replica, with auth, on its own NATS connection to `server`; its log lines go to `logs` when given. */
const replica = (server: string, ns: string, logs?: Queue.Queue<string>) =>
  Router.layer.pipe(
    Layer.provide(AuthClient.layer),
    Layer.provide(AuthService.layer),
    Layer.provide(Tokens.layer),
    Layer.provide(Telemetry.disabled),
    Layer.provide(NatsBus.layer({ servers: [server], namespace: ns })),
    Layer.provide(config),
    Layer.provide(
      logs === undefined
        ? Logger.minimumLogLevel(LogLevel.Error)
        : Layer.merge(
          Logger.replace(Logger.defaultLogger, Logger.make(({ message }) => Queue.unsafeOffer(logs, Array.isArray(message) ? message.join(" ") : String(message)))),
          Logger.minimumLogLevel(LogLevel.Debug)
        )
    )
  )

/** Where the test stands: the edge's place on the bus, on a connection of its own straight to NATS. */
const testSide = (server: string, ns: string) =>
  Layer.merge(NatsBus.layer({ servers: [server], namespace: ns }), Tokens.layer).pipe(Layer.provide(config), Layer.provide(Logger.minimumLogLevel(LogLevel.Error)))

/** Whether anyone listens on `conn`'s subject: an actor answers a `Probe` for a connection it never heard of, nobody else does. */
const listened = (conn: Subjects.ConnId) =>
  Effect.flatMap(Bus.Bus, (bus) =>
    routerPeers.ask(Peer.outside(bus, "router"), conn, new Proxy.Probe({ connectionId: "none" }), { timeout: "200 millis" }).pipe(
      Effect.either,
      Effect.map((e) => !(Either.isLeft(e) && e.left._tag === "PeerUnavailable" && e.left.reason === "NoResponders"))
    ))

/** Polls, with a deadline, until `conn`'s actor is (or is not) reachable over NATS. */
const untilListened = (conn: Subjects.ConnId, wanted: boolean) =>
  listened(conn).pipe(
    Effect.filterOrFail((l) => l === wanted, () => "not yet"),
    Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 500 }),
    Effect.orDieWith(() => new Error(`${conn} was ${wanted ? "never" : "still"} reachable after 10 s`)),
    Effect.asVoid
  )

/** The next line a replica logged that contains `text`, within 10 s. */
const logged = (logs: Queue.Queue<string>, text: string) =>
  Queue.take(logs).pipe(
    Effect.repeat({ until: (line) => line.includes(text) }),
    Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error(`the replica never logged ${JSON.stringify(text)}`) }),
    Effect.orDie
  )

/** A request forwarded, answered by the extension, and its answer back at the client. */
const roundTrip = (client: ActorClient.ActorClient, ext: ActorClient.ActorClient, id: number) =>
  Effect.gen(function*() {
    yield* client.send({ jsonrpc: "2.0", id, method: "getTabs" })
    const forwarded = yield* nextBut(ext)
    yield* ext.send({ jsonrpc: "2.0", id: forwarded.id, result: { tabs: [id] } })
    expect(yield* nextBut(client, "")).toEqual({ jsonrpc: "2.0", id, result: { tabs: [id] } })
  })

/**
 * Replica C (through relay `toC`) hosting alice's MCP client, replica E (through `toE`) hosting her
 * extension, and the client connected to it. C's log lines go to `logs`, E's to `eLogs`. The
 * client opens while C is the only replica, the extension while C is cut off: each lands where
 * the test wants it.
 */
const placed = Effect.gen(function*() {
  const { url } = yield* NatsServer
  const ns = namespace()
  const toC = yield* Relay.make(url)
  const toE = yield* Relay.make(url)
  const logs = yield* Queue.unbounded<string>()
  const eLogs = yield* Queue.unbounded<string>()
  const here = yield* Layer.build(testSide(url, ns))
  yield* Layer.build(replica(toC.url, ns, logs))
  return yield* Effect.gen(function*() {
    const client = yield* mcpClient("alice")
    yield* toC.cut
    yield* untilListened(client.conn, false)
    yield* Layer.build(replica(toE.url, ns, eLogs))
    const ext = yield* extension("alice")
    yield* toC.restore
    yield* untilListened(client.conn, true)
    const connected = yield* call(client, 2, "connect", { extension_id: ext.id })
    const connectionId = connected.result?.["connection_id"]
    if (typeof connectionId !== "string") return yield* Effect.dieMessage(`connect failed: ${JSON.stringify(connected)}`)
    expect(yield* next(client)).toMatchObject({ method: "status", params: { connected: true, peer_count: 1 } })
    // After `authenticated`, the extension had a status with no peers, then this one.
    expect(yield* next(ext.client)).toMatchObject({ method: "status", params: { connected: true, peer_count: 0 } })
    expect(yield* next(ext.client)).toMatchObject({ method: "status", params: { connected: true, peer_count: 1 } })
    yield* roundTrip(client, ext.client, 3)
    return { toC, toE, logs, eLogs, here, client, ext: ext.client, connectionId }
  }).pipe(Effect.provide(here))
})

layer(NatsServer.layer, { excludeTestServices: true, timeout: "120 seconds" })("a router replica that lost its NATS connection", (it) => {
  it.scoped("C ends a session whose ExtensionGone was lost once it is back, and leaves a healthy one alone, slow answers included", () =>
    Effect.gen(function*() {
      const { toC, toE, logs, here, client, ext, connectionId } = yield* placed
      yield* Effect.gen(function*() {
        // 1. C's connection drops and comes back with nothing lost: the probe finds the session attached.
        yield* toC.cut
        yield* untilListened(client.conn, false)
        yield* toC.restore
        yield* logged(logs, `for ${connectionId}: attached`)
        expect(yield* client.pending).toBe(0)
        yield* roundTrip(client, ext, 4)

        // 2. NATS is slow towards E: a request times out, and so does the probe it starts. No
        // answer is no proof: the session carries on.
        yield* toE.pause
        yield* client.send({ jsonrpc: "2.0", id: 5, method: "slow" })
        expect((yield* nextBut(client)).error).toEqual({ code: -32000, message: "Request timed out after 1s" })
        yield* logged(logs, `for ${connectionId}: unknown`)
        yield* toE.resume
        expect(yield* client.pending).toBe(0)
        expect((yield* nextBut(ext)).id).toBe(`${connectionId}:5`)
        yield* roundTrip(client, ext, 6)
        expect(yield* client.pending).toBe(0)

        // 3. The extension closes while C is cut off: its actor's ExtensionGone reaches nobody.
        yield* toC.cut
        yield* untilListened(client.conn, false)
        yield* ext.close()
        yield* ext.ended
        const restored = Date.now()
        yield* toC.restore
        const notice = yield* nextBut(client, "").pipe(
          Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("the session never ended: the client stays attached to nothing") }),
          Effect.orDie
        )
        const tookMillis = Date.now() - restored
        expect(notice).toEqual({ jsonrpc: "2.0", method: "disconnected", params: { connection_id: connectionId, reason: "Extension gone" } })
        expect(yield* nextBut(client, "")).toMatchObject({ method: "status", params: { connected: false, peer_count: 0 } })
        yield* logged(logs, "peers of 1 proxy actors")
        console.log(`session ended ${tookMillis} ms after C's NATS connection was restored`)
        expect((yield* call(client, 7, "getTabs")).error).toEqual({ code: -32000, message: "Not connected to an extension" })
      }).pipe(Effect.provide(here))
    }), 90_000)

  it.scoped("E drops a client whose Detach was lost once it is back: the extension's peer_count comes right", () =>
    Effect.gen(function*() {
      const { toE, eLogs, here, client, ext, connectionId } = yield* placed
      yield* Effect.gen(function*() {
        yield* toE.cut
        yield* untilListened(ext.conn, false)
        // The client disconnects while E is cut off: its Detach reaches nobody; its record goes.
        expect((yield* call(client, 8, "disconnect")).result).toEqual({ disconnected: true })
        yield* toE.restore
        yield* logged(eLogs, `clients of extension conn ${ext.conn}: gone`)
        expect(yield* nextBut(ext, "").pipe(
          Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("E still counts the client that left") }),
          Effect.orDie
        )).toMatchObject({ method: "status", params: { connected: true, peer_count: 0 } })
        const asked = yield* Effect.flatMap(Bus.Bus, (bus) => routerPeers.ask(Peer.outside(bus, "router"), ext.conn, new Proxy.Probe({ connectionId }))).pipe(Effect.orDie)
        expect(asked).toEqual({ attached: false })
      }).pipe(Effect.provide(here))
    }), 90_000)
})
