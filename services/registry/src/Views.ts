/**
 * Each replica's live picture of the users its `/hub` sessions serve: the user's tab and cached-tool
 * records, followed through KV, and the aggregate built from them. One view per user per replica,
 * shared by all that user's sessions here and dropped with the last of them; one watch pair per
 * replica feeds them all.
 */
import { Kv, Subjects } from "@switchboard/bus"
import { Registry } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as FiberSet from "effect/FiberSet"
import * as Option from "effect/Option"
import * as RcMap from "effect/RcMap"
import * as Schema from "effect/Schema"
import * as Schedule from "effect/Schedule"
import * as Scope from "effect/Scope"
import * as Stream from "effect/Stream"
import * as Naming from "./Naming.ts"

const decoder = new TextDecoder()
const decodeTab = Schema.decodeUnknownOption(Schema.parseJson(Registry.TabRecord))
const decodeCached = Schema.decodeUnknownOption(Schema.parseJson(Registry.CachedToolRecord))

/** What a key holds as far as this view knows, with the revision that said so. */
interface Known<A> {
  readonly revision: number
  readonly value: A | undefined
}

/** Who hears of a view's changes: an object, so that a session listens without a closure of its own. */
export interface Listener {
  /** Called outside any actor, after the aggregate or the tabs changed. */
  readonly changed: () => void
}

export interface View {
  readonly user: string
  /** Open tabs by domain, then tab id. */
  readonly tabs: () => ReadonlyMap<string, ReadonlyMap<number, Registry.TabRecord>>
  readonly cached: (domain: string, tool: string) => Registry.CachedToolRecord | undefined
  readonly aggregate: () => Naming.Aggregate
  readonly listen: (listener: Listener) => void
  readonly unlisten: (listener: Listener) => void
}

class UserView implements View {
  private readonly tabRecords = new Map<string, Known<Registry.TabRecord>>()
  private readonly cachedRecords = new Map<string, Known<Registry.CachedToolRecord>>()
  private readonly listeners = new Set<Listener>()
  private byDomain = new Map<string, Map<number, Registry.TabRecord>>()
  private cachedByTool = new Map<string, Registry.CachedToolRecord>()
  private current: Naming.Aggregate = { tools: [], byName: new Map() }
  private scheduled = false

  constructor(readonly user: string) {}

  tabs() {
    return this.byDomain
  }
  cached(domain: string, tool: string) {
    return this.cachedByTool.get(`${domain}\u0000${tool}`)
  }
  aggregate() {
    return this.current
  }
  listen(listener: Listener) {
    this.listeners.add(listener)
  }
  unlisten(listener: Listener) {
    this.listeners.delete(listener)
  }

  applyTab(entry: Kv.KvEntry) {
    this.apply(this.tabRecords, entry, decodeTab)
  }
  applyCached(entry: Kv.KvEntry) {
    this.apply(this.cachedRecords, entry, decodeCached)
  }

  /** Newer revisions win, so the initial read and the watch may deliver in any order. */
  private apply<A>(records: Map<string, Known<A>>, entry: Kv.KvEntry, decode: (s: string) => Option.Option<A>) {
    const known = records.get(entry.key)
    if (known !== undefined && known.revision >= entry.revision) return
    const value = entry.operation === "PUT" ? Option.getOrUndefined(decode(decoder.decode(entry.value))) : undefined
    records.set(entry.key, { revision: entry.revision, value })
    // A burst of changes (a tab registering, another closing) is rebuilt once.
    if (!this.scheduled) {
      this.scheduled = true
      queueMicrotask(() => this.rebuild())
    }
  }

  rebuild() {
    this.scheduled = false
    const byDomain = new Map<string, Map<number, Registry.TabRecord>>()
    const tabs: Array<Registry.TabRecord> = []
    for (const { value } of this.tabRecords.values()) {
      if (value === undefined || value.user !== this.user) continue
      tabs.push(value)
      let domain = byDomain.get(value.domain)
      if (!domain) byDomain.set(value.domain, (domain = new Map()))
      domain.set(value.tabId, value)
    }
    const cached: Array<Registry.CachedToolRecord> = []
    const cachedByTool = new Map<string, Registry.CachedToolRecord>()
    for (const { value } of this.cachedRecords.values()) {
      if (value === undefined) continue
      cached.push(value)
      cachedByTool.set(`${value.domain}\u0000${value.tool.name}`, value)
    }
    this.byDomain = byDomain
    this.cachedByTool = cachedByTool
    this.current = Naming.aggregate(tabs, cached)
    for (const listener of this.listeners) listener.changed()
  }
}

export interface Views {
  /**
   * The user's view, released with the scope. It holds the records already in KV when this returns,
   * unless reading them failed: then it fills in as a read retried in the background succeeds.
   */
  readonly acquire: (user: string) => Effect.Effect<View, never, Scope.Scope>
}

/** How soon a failed KV watch or read is tried again: quickly at first, then every 5 s. */
const again = Schedule.exponential("200 millis").pipe(Schedule.union(Schedule.spaced("5 seconds")))

/** A tab or cached-tool key's first token: its user's (see `Subjects.Key.userTools`). */
const ownerToken = (key: string) => key.slice(0, key.indexOf("."))

export const make = Effect.gen(function*() {
  const kv = yield* Kv.Kv
  const tabs = yield* kv.bucket(Subjects.Bucket.tabs)
  const cached = yield* kv.bucket(Subjects.Bucket.cachedTools)
  // The watches run on the replica's runtime, not on that of the first view's lookup, whose
  // context (its entry's scope) they would keep; they end with the replica.
  const runWatch = yield* FiberSet.makeRuntime<never>()
  /**
   * The views held on this replica, by their user's key token: where the replica's two watches
   * deliver. A watch pair per user cost a fiber, a stream and a KV consumer each, about 100 KB
   * per user in the registry (issue 16); the records of users nobody here holds are dropped.
   */
  const held = new Map<string, UserView>()

  const followStream = (stream: Stream.Stream<Kv.KvEntry, unknown>, apply: (e: Kv.KvEntry) => void) =>
    stream.pipe(
      Stream.runForEach((e) => Effect.sync(() => apply(e))),
      // A watch fails when NATS cannot answer for a while (a node died, a leader is elected): watch
      // again, which replays each key's latest entry, rather than leave the views frozen for good.
      Effect.tapError((e) => Effect.logWarning("the registry's views lost a KV watch; watching again", e)),
      Effect.retry(again),
      Effect.catchAllCause((cause) => Effect.logError("the registry's views stopped following KV", cause)),
      runWatch
    )

  // Started with the first view, so that a replica without /hub sessions follows nothing. Each
  // watch replays every key's latest entry when it starts, and again after it failed: a change
  // that happened while it was down reaches the views then, and one made before a view's own
  // read (below) reaches it either way; the newer revision wins.
  const watch = yield* Effect.once(Effect.sync(() => {
    followStream(tabs.watch({ initial: true }), (e) => held.get(ownerToken(e.key))?.applyTab(e))
    followStream(cached.watch({ initial: true }), (e) => held.get(ownerToken(e.key))?.applyCached(e))
  }))

  const readBucket = (bucket: Kv.KvBucketShape, user: string, apply: (e: Kv.KvEntry) => void) =>
    Effect.gen(function*() {
      for (const key of yield* bucket.keys(Subjects.Key.userTools(user))) {
        const entry = yield* bucket.get(key)
        if (Option.isSome(entry)) apply(entry.value)
      }
    })

  /** The user's records already in KV: what makes a new view ready, whatever the watch replayed so far. */
  const read = (view: UserView) =>
    Effect.all([readBucket(tabs, view.user, (e) => view.applyTab(e)), readBucket(cached, view.user, (e) => view.applyCached(e))], {
      discard: true
    })

  // One view per user, shared by that user's sessions on this replica, and dropped from `held`
  // when the last session lets go. The lookup returns once the records already in KV are read,
  // and sessions that ask meanwhile wait for that same lookup.
  const byUser = yield* RcMap.make({
    lookup: (user: string) =>
      Effect.gen(function*() {
        yield* watch
        const view = new UserView(user)
        const token = ownerToken(Subjects.Key.userTools(user))
        held.set(token, view)
        yield* Scope.addFinalizer(yield* Effect.scope, Effect.sync(() => held.delete(token)))
        // A read that fails (KV times out while NATS elects a leader) is read again until it works,
        // in the view's scope: the watch brings only what changes, so a view that gave up would
        // miss its user's existing tabs until each changed. Meanwhile the view is served as it is.
        yield* read(view).pipe(
          Effect.catchAllCause((cause) =>
            Effect.logWarning(`could not read ${user}'s tabs and tools from KV; reading again in the background`, cause).pipe(
              Effect.zipRight(read(view).pipe(Effect.retry(again), Effect.forkScoped))
            )
          )
        )
        view.rebuild()
        return view
      })
  })

  return { acquire: (user) => RcMap.get(byUser, user) } satisfies Views
})
