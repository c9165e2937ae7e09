/**
 * The nats.js internals the adapter's shims rely on are where they expect, and each shim does what
 * it says, against a real server. A nats.js upgrade that moves any of them fails here, loudly,
 * instead of the adapter quietly falling back to the slower public path.
 */
import { expect, it } from "@effect/vitest"
import { TE } from "@nats-io/nats-core/internal"
import { connect, headers as natsHeaders, type Msg, MsgHdrsImpl } from "@nats-io/transport-node"
import { NatsServer } from "@switchboard/testing"
import * as Effect from "effect/Effect"
import { readFileSync } from "node:fs"
import { Socket } from "node:net"
import { corker, FrozenHeaders, installPooledEncoder, rawHeaderBlock, shapes } from "../src/internal/NatsShims.ts"

const connection = Effect.flatMap(NatsServer, ({ servers }) =>
  Effect.acquireRelease(
    Effect.promise(() => connect({ servers: [...servers] })),
    (nc) => Effect.promise(() => nc.close())
  ))

/** Publishes one message with `headers` to a fresh subject and returns it as received. */
const roundTrip = (nc: Awaited<ReturnType<typeof connect>>, headers?: Record<string, string>) =>
  Effect.promise(() => {
    const subject = `shims.${Math.random().toString(36).slice(2)}`
    const received = new Promise<Msg>((resolve) => nc.subscribe(subject, { max: 1, callback: (_, m) => resolve(m) }))
    return nc.flush().then(() => {
      const h = headers === undefined ? undefined : natsHeaders()
      for (const [k, v] of Object.entries(headers ?? {})) h?.set(k, v)
      nc.publish(subject, "payload", h === undefined ? undefined : { headers: h })
      return received
    })
  })

it.scopedLive("every internal a shim relies on has the shape it expects", () =>
  Effect.gen(function*() {
    const nc = yield* connection
    const msg = yield* roundTrip(nc, { "sb-op": "frame" })
    expect(shapes(nc, msg)).toEqual({ pooledEncoder: true, frozenHeaders: true, rawHeaderBlock: true, corker: true })
  }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)))

it.scopedLive("each shim gives what nats.js's public path gives", () =>
  Effect.gen(function*() {
    const nc = yield* connection

    // The pooled encoder: in place, with the same bytes as a TextEncoder.
    installPooledEncoder()
    const line = "HPUB a.b 12 34\r\n"
    expect(Buffer.isBuffer(TE.encode(line))).toBe(true)
    expect([...TE.encode(line)]).toEqual([...new TextEncoder().encode(line)])

    // Frozen headers: the same wire form as nats.js's, encoded once.
    const frozen = new FrozenHeaders()
    const plain = new MsgHdrsImpl()
    for (const h of [frozen, plain]) {
      h.set("sb-op", "deliver")
      h.set("sb-conn", "c1")
    }
    expect([...frozen.encode()]).toEqual([...plain.encode()])
    expect(frozen.encode()).toBe(frozen.encode())

    // The raw header block holds every header nats.js parses, and is empty without headers.
    const withHeaders = yield* roundTrip(nc, { "sb-op": "frame", "sb-conn": "c2" })
    const block = rawHeaderBlock(withHeaders)
    expect(block?.startsWith("NATS/1.0\r\n")).toBe(true)
    for (const [name, value] of [["sb-op", "frame"], ["sb-conn", "c2"]] as const) {
      expect(withHeaders.headers?.get(name)).toBe(value)
      expect(block).toContain(`\r\n${name}: ${value}\r\n`)
    }
    expect(rawHeaderBlock(yield* roundTrip(nc))).toBe("")

    // The corker finds the connection's socket, corks it, and uncorks it within two turns.
    const socket = (nc as unknown as { protocol: { transport: { socket: unknown } } }).protocol.transport.socket
    expect(socket).toBeInstanceOf(Socket)
    const cork = corker(nc)
    cork()
    expect((socket as Socket).writableCorked).toBe(1)
    yield* Effect.promise(() => new Promise((r) => setImmediate(() => setImmediate(() => setImmediate(r)))))
    expect((socket as Socket).writableCorked).toBe(0)
    // And a corked publish still arrives.
    expect(new TextDecoder().decode((yield* roundTrip(nc)).data)).toBe("payload")
  }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)))

it("pins the nats.js packages the shims were checked against to one exact version", () => {
  const manifest = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { dependencies: Record<string, string> }
  const nats = Object.entries(manifest.dependencies).filter(([name]) => name.startsWith("@nats-io/"))
  expect(nats.length).toBeGreaterThan(0)
  for (const [name, range] of nats) expect(`${name}@${range}`).toMatch(/@\d+\.\d+\.\d+$/)
})
