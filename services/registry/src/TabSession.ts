/**
 * The actor of a tab bridge's socket (`/tabs`): the tab says who it is (`browser/hello`), registers
 * its page's tools, and keeps them in KV (user → domain → tab) while its socket is open. The tab's
 * answers to calls go on to the `/hub` session that asked, told as `Registry.FromTab` (`ToolCall.ts`).
 */
import { Actors, Subjects } from "@switchboard/bus"
import { Edge, JsonRpc, Registry } from "@switchboard/protocol"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import * as Rejections from "./Rejections.ts"
import * as Replica from "./Replica.ts"
import { failure, result, sameJson } from "./Replies.ts"
import { WarningThrottle } from "./WarningThrottle.ts"

const { ErrorCode } = JsonRpc
const CloseCode = Edge.CloseCode
const { Method } = Registry
const isRecord = JsonRpc.isRecord

const decodeHello = Schema.decodeUnknownEither(Registry.Hello)
const decodeRegister = Schema.decodeUnknownEither(Registry.RegisterTools)

/** The same tools, in whatever order the page lists them. */
const sameTools = (a: ReadonlyArray<Registry.Tool>, b: ReadonlyArray<Registry.Tool>) => {
  if (a.length !== b.length) return false
  const byName = new Map(b.map((t) => [t.name, t]))
  return a.every((t) => sameJson(t, byName.get(t.name)))
}

/** DNS caps a name at 253 characters; the domain goes into every one of its tools' descriptions. */
const MaxHostname = 253
/** A page title goes into every one of the tab's tools' descriptions; longer ones are cut. */
const MaxTitle = 256

/** The host (with port) of an http(s) URL, or undefined. */
export const hostOf = (url: string): string | undefined => {
  try {
    const u = new URL(url)
    return (u.protocol === "http:" || u.protocol === "https:") && u.host !== "" && u.hostname.length <= MaxHostname ? u.host : undefined
  } catch {
    return undefined
  }
}

export const make = (replica: Replica.Replica) => (conn: Actors.Connection, restored: boolean) =>
  Effect.gen(function*() {
    const { cachedTools, config, deadline, forget, link, recall, remember, tabs } = replica
    const user = conn.user
    if (user === undefined) return yield* Effect.fail(new Actors.Refuse(CloseCode.PolicyViolation, "Authentication required"))
    const origin = conn.open.origin === undefined ? undefined : hostOf(conn.open.origin)
    let tab: Registry.TabRecord | undefined
    let key = ""
    /** The cached tools this actor last wrote, so re-registering the same list writes nothing. */
    const written = new Map<string, Registry.CachedToolRecord>()
    /** What the tab sends wrong is logged at this rate, however fast it sends it. */
    const warnings = new WarningThrottle(Duration.toMillis(config.warningInterval))
    const warn = (message: string) => {
      const line = warnings.admit(`tab ${tab === undefined ? conn.id : `${tab.tabId} of ${tab.domain} (${conn.id})`}: ${message}`)
      return line === undefined ? Effect.void : Effect.logWarning(line)
    }

    const saved = restored ? yield* recall(conn) : Option.none()
    if (Option.isSome(saved) && saved.value.role === "tab") {
      key = Subjects.Key.tab(user, saved.value.domain, saved.value.tabId)
      const found = yield* tabs.get(key).pipe(Effect.orElseSucceed(() => Option.none()))
      if (Option.isSome(found) && found.value.value.conn === conn.id) tab = found.value.value
    }
    const helloTimer = tab === undefined ? yield* deadline(conn, `${Method.hello} expected first`) : undefined

    /** Whether the record was stored; a failure is logged. */
    const save = (next: Registry.TabRecord) =>
      tabs.put(key, next).pipe(
        Effect.tap(() => Effect.sync(() => (tab = next))),
        Effect.as(true),
        Effect.catchAll((e) => Effect.as(Effect.logWarning(`could not store tab ${next.tabId} of ${next.domain}`, e), false))
      )
    const answer = (id: JsonRpc.Id | undefined, value: unknown) => (id === undefined ? undefined : conn.send(result(id, value)))
    /** A request gets the error; a notification can only be logged. */
    const refuse = (id: JsonRpc.Id | undefined, code: number, message: string) =>
      id === undefined ? warn(message) : Effect.sync(() => conn.send(failure(id, code, message)))

    const hello = (params: unknown, id: JsonRpc.Id | undefined) =>
      Effect.gen(function*() {
        const decoded = decodeHello(params ?? {})
        if (Either.isLeft(decoded)) {
          return conn.close(CloseCode.ProtocolError, `${Method.hello}: expected {tabId, url, title?, active?}`)
        }
        const { active, tabId, url } = decoded.right
        const title = decoded.right.title?.slice(0, MaxTitle)
        const domain = hostOf(url)
        if (domain === undefined) return conn.close(CloseCode.ProtocolError, `${Method.hello}: url must be an http(s) URL with a host name of at most ${MaxHostname} characters`)
        if (origin !== undefined && origin !== domain) {
          return conn.close(CloseCode.PolicyViolation, `the tab's url (${domain}) does not match its Origin (${origin})`)
        }
        if (tab !== undefined) {
          if (tab.tabId !== tabId || tab.domain !== domain) {
            return yield* refuse(id, ErrorCode.InvalidRequest, "Invalid Request: a tab's identity cannot change; open a new socket after navigating")
          }
          yield* save({ ...tab, url, ...(title === undefined ? {} : { title }), activatedAt: active === true ? Date.now() : tab.activatedAt })
          return answer(id, { domain, tabId })
        }
        helloTimer?.cancel()
        key = Subjects.Key.tab(user, domain, tabId)
        // A page reload reconnects with the same tab id: the new socket replaces the old one.
        const previous = yield* tabs.get(key).pipe(Effect.orElseSucceed(() => Option.none()))
        if (Option.isSome(previous) && previous.value.value.conn !== conn.id) {
          const old = previous.value.value
          link.close(Subjects.EdgeId(old.edge), Subjects.ConnId(old.conn), CloseCode.Normal, "replaced by a newer connection of the same tab")
        }
        const now = Date.now()
        yield* save({
          user,
          domain,
          tabId,
          url,
          ...(title === undefined ? {} : { title }),
          conn: conn.id,
          edge: conn.edge,
          activatedAt: active === true ? now : 0,
          updatedAt: now,
          tools: []
        })
        yield* remember(conn, { role: "tab", user, domain, tabId })
        yield* Effect.logDebug(`tab ${tabId} of ${domain} (user ${user}) connected`)
        return answer(id, { domain, tabId })
      })

    const register = (current: Registry.TabRecord, method: string, params: unknown, id: JsonRpc.Id | undefined) =>
      Effect.gen(function*() {
        const decoded = decodeRegister(params ?? {})
        if (Either.isLeft(decoded)) return yield* refuse(id, ErrorCode.InvalidParams, `Invalid params: ${method} expects {tools: Tool[]}`)
        const accepted: Array<Registry.Tool> = []
        const rejected: Array<Registry.ToolRejection> = []
        const names = new Set<string>()
        for (const candidate of decoded.right.tools) {
          const tool = Registry.validateTool(candidate, config.maxToolBytes)
          if (Either.isLeft(tool)) rejected.push(tool.left)
          else if (names.has(tool.right.name)) rejected.push(Registry.rejectTool("duplicate", tool.right.name, "listed twice; the first one counts"))
          else if (accepted.length >= config.maxToolsPerTab) {
            rejected.push(Registry.rejectTool("over-limit", tool.right.name, `over the limit of ${config.maxToolsPerTab} tools per tab`))
          } else {
            names.add(tool.right.name)
            accepted.push(tool.right)
          }
        }
        // One bounded line, at a bounded rate: the tab's answer has the details.
        if (rejected.length > 0) yield* warn(Rejections.logLine(rejected))
        const tabUrl = decoded.right.tabUrl
        const url = tabUrl !== undefined && hostOf(tabUrl) === current.domain ? tabUrl : current.url
        // Idempotent: the same list again changes nothing and tells nobody.
        if (url !== current.url || !sameTools(accepted, current.tools)) {
          const stored = yield* save({ ...current, url, tools: accepted, updatedAt: Date.now() })
          if (!stored) return yield* refuse(id, ErrorCode.InternalError, `Internal error: could not store the tab's tools; send ${method} again`)
        }
        // Only the tools this tab still lists can be written again; the rest would only grow the map.
        for (const name of written.keys()) if (!names.has(name)) written.delete(name)
        for (const tool of accepted) {
          if (!Registry.isCached(tool)) continue
          const record: Registry.CachedToolRecord = { domain: current.domain, url, tool, cachedAt: Date.now() }
          const last = written.get(tool.name)
          if (last !== undefined && last.url === url && sameJson(last.tool, tool)) continue
          written.set(tool.name, record)
          yield* cachedTools.put(Subjects.Key.cachedTool(user, current.domain, tool.name), record).pipe(
            Effect.catchAll((e) => Effect.logWarning(`could not cache tool ${tool.name}`, e))
          )
        }
        return answer(id, { registered: accepted.length, ...Rejections.forTab(rejected) })
      })

    /** A response or progress notification for a hub session: its id or token starts with the session's conn id. */
    const toHub = (frame: Actors.Frame, message: Record<string, unknown>, routing: unknown) => {
      if (typeof routing !== "string") return
      const hub = routing.slice(0, routing.indexOf(":"))
      if (!Subjects.isConnId(hub)) return
      // Parsed once, here: a hub actor on this replica takes the value as it is.
      Replica.peers.tell(conn, hub, { _tag: "FromTab", tab: conn.id, message }, frame.traceparent)
    }

    const onFrame = (frame: Actors.Frame): Effect.Effect<void> | void => {
      const decoded = JsonRpc.decodeFrame(frame.text)
      if (Either.isLeft(decoded)) return conn.send(JsonRpc.encode(decoded.left))
      const incoming = decoded.right
      const message = incoming.message as Record<string, unknown>
      if (incoming._tag === "Response") return toHub(frame, message, message["id"])
      const { method, params } = incoming.message as JsonRpc.Notification
      const id = incoming._tag === "Request" ? incoming.message.id : undefined
      if (method === "notifications/progress") return toHub(frame, message, isRecord(params) ? params["progressToken"] : undefined)
      if (method === "notifications/cancelled") return toHub(frame, message, isRecord(params) ? params["requestId"] : undefined)
      if (frame.limited) return refuse(id, ErrorCode.ServerError, "Rate limit exceeded")
      if (method === Method.hello) return hello(params, id)
      const current = tab
      if (current === undefined) return refuse(id, ErrorCode.InvalidRequest, `Invalid Request: send ${Method.hello} first`)
      switch (method) {
        case Method.registerTools:
        case Method.updateTools:
          return register(current, method, params, id)
        case Method.activated:
          return Effect.zipRight(save({ ...current, activatedAt: Date.now() }), Effect.sync(() => answer(id, {})))
      }
      if (id !== undefined) return conn.send(failure(id, ErrorCode.MethodNotFound, `Method not found: ${method}`))
    }

    const onClosed = () =>
      Effect.gen(function*() {
        yield* forget(conn)
        if (tab === undefined) return
        const current = yield* tabs.get(key)
        // A newer socket of the same tab may own the entry already.
        if (Option.isSome(current) && current.value.value.conn === conn.id) yield* tabs.delete(key)
      }).pipe(Effect.catchAll((e) => Effect.logWarning(`could not remove closed tab ${conn.id}; it is pruned once stale`, e)))

    return { onFrame, onClosed } satisfies Actors.Actor
  })
