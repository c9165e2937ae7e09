/**
 * Each replica's live picture of the users its `/hub` sessions serve: the user's tab and cached-tool
 * records, followed in KV (`follow`), and the aggregate built from them. One follower pair per user
 * per replica, shared by all that user's sessions here and dropped with the last of them.
 */
import { Kv, Subjects } from "@switchboard/bus"
import { Registry } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as RcMap from "effect/RcMap"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
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
  /** The user's view, ready (initial records read) when this returns; released with the scope. */
  readonly acquire: (user: string) => Effect.Effect<View, never, Scope.Scope>
}

export const make = Effect.gen(function*() {
  const kv = yield* Kv.Kv
  const tabs = yield* kv.bucket(Subjects.Bucket.tabs)
  const cached = yield* kv.bucket(Subjects.Bucket.cachedTools)

  // One view per user, shared by that user's sessions on this replica; its watches live in the
  // entry's scope, which closes when the last session lets go. The lookup returns once the
  // initial records are read, and sessions that ask meanwhile wait for that same lookup.
  const byUser = yield* RcMap.make({
    lookup: (user: string) =>
      Effect.gen(function*() {
        const view = new UserView(user)
        const filter = Subjects.Key.userTools(user)
        yield* Effect.all([tabs.follow(filter, (e) => view.applyTab(e)), cached.follow(filter, (e) => view.applyCached(e))])
        view.rebuild()
        return view
      })
  })

  return { acquire: (user) => RcMap.get(byUser, user) } satisfies Views
})
