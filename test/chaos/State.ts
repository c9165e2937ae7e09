/**
 * State written through the protocols before the faults, and checked after each one: the stable
 * extension ids of browsers that sent a `client_id` (`router_extension_ids`), cached tools that
 * outlive their tabs (`registry_cached_tools`), both read straight from KV, and a topic's history
 * (a journal), read through the history API. Nothing of it is touched by the traffic.
 */
import { Actors, Kv, NatsBus, Subjects } from "@switchboard/bus"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import { token } from "../src/support/Stack.ts"
import { type Json, openLine } from "./Line.ts"

const USERS = 4
const DOMAIN = "kv.example.com"
const TOPIC = "chaos-kv"
const ENVELOPES = 10

const decoder = new TextDecoder()
const retry = { schedule: Schedule.spaced("250 millis"), times: 80 }

const take = (incoming: Queue.Queue<Json>, ok: (m: Json) => boolean) =>
  Effect.iterate(undefined as Json | undefined, { while: (m) => m === undefined || !ok(m), body: () => Queue.take(incoming) }).pipe(
    Effect.map((m) => m as Json),
    Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("the expected message did not come") })
  )

export interface Snapshot {
  /** KV records by bucket and key, with their values. */
  readonly records: ReadonlyArray<{ readonly bucket: Kv.BucketSpec; readonly key: string; readonly value: string }>
  readonly envelopes: ReadonlyArray<string>
}

/** A reader of the state through its own NATS connection, and an HTTP client of an edge for the history. */
export const stateOf = (servers: ReadonlyArray<string>, namespace: string) =>
  Effect.gen(function*() {
    const kv = Context.get(yield* Layer.build(NatsBus.layer({ servers, namespace, replicas: 3, name: "chaos-state" })), Kv.Kv)
    const reader = yield* token({ sub: "chaos-kv-reader", ttl: "2 hours" })
    const read = (bucket: Kv.BucketSpec, key: string) =>
      kv.bucket(bucket).pipe(
        Effect.flatMap((b) => b.get(key)),
        Effect.map(Option.map((e) => decoder.decode(e.value))),
        Effect.retry(retry)
      )
    const history = (http: () => string | undefined) =>
      Effect.tryPromise(async () => {
        const base = http()
        if (base === undefined) throw new Error("no edge serves")
        const res = await fetch(`${base}/v0/topics/${TOPIC}/history?limit=100`, { headers: { authorization: `Bearer ${reader}` }, signal: AbortSignal.timeout(5_000) })
        if (res.status !== 200) throw new Error(`history answered ${res.status}: ${await res.text()}`)
        return ((await res.json()) as { readonly envelopes: ReadonlyArray<Json> }).envelopes.map((e) => String(e["id"]))
      }).pipe(Effect.retry(retry))

    /** Writes the state and returns the snapshot to compare with later. */
    const write = (ws: (i: number) => string) =>
      Effect.gen(function*() {
        const expected: Array<{ readonly bucket: Kv.BucketSpec; readonly key: string }> = []
        for (let i = 0; i < USERS; i++) {
          const user = `chaos-kv-${i}`
          const t = yield* token({ sub: user })
          const clientId = `kv-browser-${i}`
          yield* Effect.scoped(Effect.gen(function*() {
            const ext = yield* Effect.acquireRelease(openLine(i, `${ws(i)}/extension`), (l) => Effect.sync(l.close))
            const ask = yield* take(ext.incoming, (m) => m["method"] === "authenticate")
            ext.send({ jsonrpc: "2.0", id: ask["id"], result: { name: "KV", accessToken: t, client_id: clientId } })
            yield* take(ext.incoming, (m) => m["method"] === "authenticated")
          }))
          expected.push({ bucket: Subjects.Bucket.extensionIds, key: Subjects.Key.extensionId(user, clientId) })
          yield* Effect.scoped(Effect.gen(function*() {
            const tab = yield* Effect.acquireRelease(openLine(i, `${ws(i)}/tabs?token=${t}`), (l) => Effect.sync(l.close))
            yield* tab.request("browser/hello", { tabId: 7, url: `https://${DOMAIN}/` })
            yield* tab.request("browser/registerTools", { tools: [{ name: `note${i}`, inputSchema: { type: "object" }, annotations: { cache: true } }] })
          }))
          expected.push({ bucket: Subjects.Bucket.cachedTools, key: Subjects.Key.cachedTool(user, DOMAIN, `note${i}`) })
        }
        const envelopes = Array.from({ length: ENVELOPES }, (_, i) => `chaos-kv-envelope-${i}`)
        yield* Effect.scoped(Effect.gen(function*() {
          const writer = "chaos-kv-writer"
          const t = yield* token({ sub: writer })
          const line = yield* Effect.acquireRelease(openLine(0, `${ws(0)}/v0/ws?topic=${TOPIC}&token=${t}`), (l) => Effect.sync(l.close))
          yield* take(line.incoming, (m) => (m["payload"] as Json | undefined)?.["event"] === "welcome")
          for (const id of envelopes) {
            line.send({ protocol: "mcpx/v0.1", id, from: writer, kind: "chat", payload: { text: id } })
            yield* take(line.incoming, (m) => m["id"] === id)
          }
        }))
        // Written: every record is there (the tabs' and extensions' closing does not remove them).
        const records = yield* Effect.forEach(expected, ({ bucket, key }) =>
          read(bucket, key).pipe(
            Effect.flatMap(Option.match({ onNone: () => Effect.fail(new Error(`${bucket.name} ${key} was not written`)), onSome: Effect.succeed })),
            Effect.retry(retry),
            Effect.map((value) => ({ bucket, key, value }))
          ))
        return { records, envelopes } satisfies Snapshot
      })

    /** How many of the snapshot's records and envelopes are missing or changed now. */
    const lost = (snapshot: Snapshot, http: () => string | undefined) =>
      Effect.gen(function*() {
        let lost = 0
        for (const r of snapshot.records) {
          const now = yield* read(r.bucket, r.key).pipe(Effect.orElseSucceed(() => Option.none<string>()))
          if (Option.getOrUndefined(now) !== r.value) {
            lost++
            yield* Effect.logError(`lost KV state: ${r.bucket.name} ${r.key} was ${r.value}, is ${Option.getOrElse(now, () => "missing")}`)
          }
        }
        const ids = new Set(yield* history(http).pipe(Effect.orElseSucceed(() => [] as ReadonlyArray<string>)))
        for (const id of snapshot.envelopes) {
          if (!ids.has(id)) {
            lost++
            yield* Effect.logError(`lost history: ${TOPIC} ${id}`)
          }
        }
        return lost
      })

    /** How many connections (of `users` only, if given) each replica of `service` owns now, by replica id. */
    const owners = (service: Subjects.ServiceName, users?: ReadonlySet<string>) =>
      kv.bucket(Subjects.Bucket.connections).pipe(
        Effect.flatMap((b) => Kv.typed(b, Actors.ConnectionRecord).values()),
        Effect.map((records) => {
          const count = new Map<string, number>()
          for (const { value } of records) {
            if (value.service !== service || (users !== undefined && !users.has(value.open.claims?.sub ?? ""))) continue
            count.set(value.replica, (count.get(value.replica) ?? 0) + 1)
          }
          return count
        }),
        Effect.retry(retry)
      )
    /** The broker replica that sequences `topic`. */
    const sequencer = (topic: string) => read(Subjects.Bucket.topics, Subjects.Key.topic(topic))

    return { write, lost, owners, sequencer }
  })

