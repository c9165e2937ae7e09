/**
 * The nats.js internals the adapter's shims rely on are where they expect, and each shim does what
 * it says, against a real server. A nats.js upgrade that moves any of them fails here, loudly,
 * instead of the adapter quietly falling back to the slower public path.
 */
import { expect, it } from "@effect/vitest"
import { TE } from "@nats-io/nats-core/internal"
import { jetstreamManager } from "@nats-io/jetstream"
import { Kvm } from "@nats-io/kv"
import { connect, headers as natsHeaders, type Msg, MsgHdrsImpl } from "@nats-io/transport-node"
import { NatsServer } from "@switchboard/testing"
import * as Effect from "effect/Effect"
import { existsSync, readdirSync, readFileSync } from "node:fs"
import { Socket } from "node:net"
import { corker, FrozenHeaders, installPooledEncoder, rawHeaderBlock, shapes, watchConsumer } from "../src/internal/NatsShims.ts"

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

/** A watch on a fresh KV bucket, stopped with the scope. */
const kvWatch = (nc: Awaited<ReturnType<typeof connect>>) =>
  Effect.acquireRelease(
    Effect.promise(async () => (await new Kvm(nc).create(`shims${Math.random().toString(36).slice(2, 8)}`)).watch()),
    (it) => Effect.sync(() => it.stop())
  )

it.scopedLive("every internal a shim relies on has the shape it expects", () =>
  Effect.gen(function*() {
    const nc = yield* connection
    const msg = yield* roundTrip(nc, { "sb-op": "frame" })
    const watch = yield* kvWatch(nc)
    expect(shapes(nc, msg, watch)).toEqual({ pooledEncoder: true, frozenHeaders: true, rawHeaderBlock: true, corker: true, watchConsumer: true })
  }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)))

it.scopedLive("each shim gives what nats.js's public path gives", () =>
  Effect.gen(function*() {
    const nc = yield* connection

    // The pooled encoder: in place, with the same bytes as a TextEncoder.
    installPooledEncoder()
    const line = "HPUB a.b 12 34\r\n"
    expect(Buffer.isBuffer(TE.encode(line))).toBe(true)
    expect([...TE.encode(line)]).toEqual([...new TextEncoder().encode(line)])

    // Frozen headers: the same wire form as nats.js's, refusing what nats.js refuses, and unchangeable.
    const plain = new MsgHdrsImpl()
    plain.set("sb-op", "deliver")
    plain.set("sb-conn", "c1")
    plain.set("sb-user", " zoë ")
    const frozen = FrozenHeaders.of({ "sb-op": "deliver", "sb-conn": "c1", "sb-user": " zoë " })!
    expect(Buffer.from(frozen.encode()).toString()).toBe(Buffer.from(plain.encode()).toString())
    expect(frozen.size()).toBe(0)
    expect(FrozenHeaders.of({})).toBeUndefined()
    expect(() => FrozenHeaders.of({ "sb user": "x" })).toThrow("' ' is not a valid character in a header name")
    expect(() => FrozenHeaders.of({ "sb:user": "x" })).toThrow("':' is not a valid character in a header name")
    expect(() => FrozenHeaders.of({ "sb-user": "a\r\nsb-op: spoofed" })).toThrow("values cannot contain")
    expect(() => plain.set("sb user", "x")).toThrow()
    expect(() => plain.set("sb-user", "a\nb")).toThrow()
    expect(() => frozen.set("sb-op", "frame")).toThrow("frozen headers cannot change")
    const published = yield* Effect.promise(() => {
      const subject = `shims.${Math.random().toString(36).slice(2)}`
      const received = new Promise<Msg>((resolve) => nc.subscribe(subject, { max: 1, callback: (_, m) => resolve(m) }))
      return nc.flush().then(() => {
        nc.publish(subject, "payload", { headers: frozen })
        return received
      })
    })
    expect([published.headers?.get("sb-op"), published.headers?.get("sb-conn")]).toEqual(["deliver", "c1"])

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

    // A watch's consumer answers for itself while it exists, and not once it is gone.
    const consumer = watchConsumer(yield* kvWatch(nc))
    expect(consumer).toBeDefined()
    const info = (yield* Effect.promise(() => consumer!.info())) as { readonly name: string; readonly stream_name: string }
    expect(info.stream_name).toMatch(/^KV_shims/)
    const jsm = yield* Effect.promise(() => jetstreamManager(nc))
    yield* Effect.promise(() => jsm.consumers.delete(info.stream_name, info.name))
    expect(yield* Effect.promise(() => consumer!.info().then(() => "found", () => "gone"))).toBe("gone")
  }).pipe(Effect.scoped, Effect.provide(NatsServer.layer)))

/** A package.json's own dependencies of every kind, by name. */
const dependenciesOf = (path: URL): Record<string, string> => {
  const manifest = JSON.parse(readFileSync(path, "utf8")) as Partial<Record<"dependencies" | "devDependencies" | "peerDependencies", Record<string, string>>>
  return { ...manifest.peerDependencies, ...manifest.devDependencies, ...manifest.dependencies }
}

it("pins the nats.js packages the shims were checked against to one exact version, in every package and the lockfile", () => {
  const root = new URL("../../../", import.meta.url)
  const workspaces = (JSON.parse(readFileSync(new URL("package.json", root), "utf8")) as { workspaces: Array<string> }).workspaces
  // The workspace globs are `dir/*` or a plain directory.
  const packages = workspaces.flatMap((w) =>
    w.endsWith("/*")
      ? readdirSync(new URL(w.slice(0, -1), root), { withFileTypes: true }).filter((d) => d.isDirectory()).map((d) => `${w.slice(0, -1)}${d.name}/`)
      : [`${w}/`]
  ).filter((dir) => existsSync(new URL(`${dir}package.json`, root)))
  expect(packages).toContain("libs/bus/")

  const wanted = new Map<string, string>()
  for (const dir of ["", ...packages]) {
    for (const [name, range] of Object.entries(dependenciesOf(new URL(`${dir}package.json`, root)))) {
      if (!name.startsWith("@nats-io/")) continue
      expect(`${dir}package.json: ${name}@${range}`).toMatch(/@\d+\.\d+\.\d+$/)
      expect(`${dir}package.json: ${name}@${range}`).toBe(`${dir}package.json: ${name}@${wanted.get(name) ?? range}`)
      wanted.set(name, range)
    }
  }
  expect([...wanted.keys()]).toContain("@nats-io/nats-core")

  // What npm installs is the lockfile: one copy of each, at the pinned version.
  const lock = JSON.parse(readFileSync(new URL("package-lock.json", root), "utf8")) as { packages: Record<string, { version?: string }> }
  for (const [name, version] of wanted) {
    const copies = Object.entries(lock.packages).filter(([path]) => path === `node_modules/${name}` || path.endsWith(`/node_modules/${name}`))
    expect(copies.map(([path, p]) => `${path}@${p.version}`)).toEqual([`node_modules/${name}@${version}`])
  }
})
