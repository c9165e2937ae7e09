/**
 * MCP-B (`shared/specs/mcp-b.md`): the messages between a tab bridge (`/tabs`) and the hub, the
 * registry's KV records, and the messages its actors exchange. The MCP side (`/hub`) is plain MCP
 * (2024-11-05 to 2025-11-25) over WebSocket (`shared/specs/mcp-websocket-transport.md`) or
 * Streamable HTTP.
 */
import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { Id, isRecord, Notification, Response as JsonRpcResponse } from "./JsonRpc.ts"
import * as ParamHeaders from "./ParamHeaders.ts"

// The plain parts (method names, revisions, the tab's answer) are shared with the browser
// bundles, so they live where effect is not imported.
export {
  Authenticate,
  type ExecuteResult,
  type ExecuteToolParams,
  HttpProtocolVersions,
  isExecuteResult,
  Method,
  ProtocolVersions,
  TabNotFound
} from "./browser/Registry.ts"

/** MCP caps tool names at 128 characters; a page's own tool name may be no longer. */
export const MaxToolName = 128

/** A JSON object: not an array, not null. */
const JsonObject = Schema.declare(isRecord, { identifier: "JsonObject" })

const ToolRejectionKind = Schema.Literal("not-an-object", "no-name", "long-name", "input-schema", "field-type", "too-large", "duplicate", "over-limit")
const isRejectionKind = Schema.is(ToolRejectionKind)

/** Why a tool from a page was not registered; `kind` groups reasons for a summary. */
export interface ToolRejection {
  readonly kind: typeof ToolRejectionKind.Type
  /** The tool's name, cut short, when it had a string one. */
  readonly name: string | undefined
  readonly reason: string
}

/** The `ToolRejection` kind a schema's refusal is, read back by `validateTool`. */
const RejectionKind = Symbol.for("@switchboard/protocol/Registry/RejectionKind")

/** Annotations that make a refusal by this schema a rejection of `kind` whose reason is `why`. */
const rejects = (kind: ToolRejection["kind"], why: string) => ({ [RejectionKind]: kind, message: () => why })

/** A field a tool must have: missing, it is the rejection `kind`, saying `why`. */
const required = <A, I>(schema: Schema.Schema<A, I>, kind: ToolRejection["kind"], why: string) =>
  Schema.propertySignature(schema).annotations({ [RejectionKind]: kind, missingMessage: () => why })

const NoName = "a tool needs a non-empty string name"
const NotObjectSchema = `inputSchema must be a JSON Schema with type "object"`

// One reason for any icon that is wrong, however deep: the page's author needs the shape, not the path.
const IconsWhy = "icons must be an array of {src: string, mimeType?, sizes?, theme?}"
/** MCP 2025-11-25's `Icon`: a URL or data URI, with what a client needs to pick one. */
const Icon = Schema.Struct({
  src: Schema.String,
  mimeType: Schema.optional(Schema.String),
  sizes: Schema.optional(Schema.Array(Schema.String)),
  theme: Schema.optional(Schema.Literal("light", "dark"))
})

/**
 * An MCP `Tool` as a page declares it; unknown fields are dropped. The fields are checked in the
 * order they are declared, and the first that fails is the rejection, with the kind and reason its
 * schema is annotated with (`validateTool`).
 */
export const Tool = Schema.Struct({
  name: required(
    Schema.String.annotations(rejects("no-name", NoName)).pipe(
      Schema.minLength(1, rejects("no-name", NoName)),
      Schema.maxLength(MaxToolName, rejects("long-name", `the name is longer than ${MaxToolName} characters`))
    ),
    "no-name",
    NoName
  ),
  inputSchema: required(
    JsonObject.annotations(rejects("input-schema", NotObjectSchema)).pipe(
      Schema.filter((schema) => schema["type"] === "object", rejects("input-schema", NotObjectSchema)),
      // MCP 2026-07-28: a client on Streamable HTTP must drop a tool whose x-mcp-header is
      // invalid; refused here, the page hears why and no client has to.
      Schema.filter((schema) => {
        const invalid = ParamHeaders.invalidAnnotation(schema)
        return invalid === undefined || `inputSchema: ${invalid}`
      }, { [RejectionKind]: "input-schema" })
    ),
    "input-schema",
    NotObjectSchema
  ),
  title: Schema.optional(Schema.String.annotations(rejects("field-type", "title must be a string"))),
  description: Schema.optional(Schema.String.annotations(rejects("field-type", "description must be a string"))),
  outputSchema: Schema.optional(JsonObject.annotations(rejects("field-type", "outputSchema must be an object"))),
  annotations: Schema.optional(JsonObject.annotations(rejects("field-type", "annotations must be an object"))),
  // MCP 2025-11-25's tool icons, passed on as the page gave them; the client decides what to show.
  icons: Schema.optional(Schema.Array(Icon).annotations({ ...rejects("field-type", IconsWhy), message: () => ({ message: IconsWhy, override: true }) }))
})
export type Tool = typeof Tool.Type

/** A name as it appears in a reason: quoted, and never long enough to blow up a log line. */
const quoted = (name: string) => (name.length > 40 ? `${JSON.stringify(name.slice(0, 40))}…` : JSON.stringify(name))

export const rejectTool = (kind: ToolRejection["kind"], name: string | undefined, why: string): ToolRejection => ({
  kind,
  name: name === undefined ? undefined : name.slice(0, 40),
  reason: name === undefined ? why : `tool ${quoted(name)}: ${why}`
})

/** UTF-8 length of a string, without encoding it. */
export const utf8Length = (s: string): number => {
  let bytes = 0
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i)
    // A surrogate pair is one 4-byte character: 2 bytes for each of its halves.
    bytes += c < 0x80 ? 1 : c < 0x800 || (c >= 0xd800 && c <= 0xdfff) ? 2 : 3
  }
  return bytes
}

/**
 * A tool from a page, at most `maxBytes` of JSON as stored (every tool is listed on every
 * `tools/list` page it falls on, and copied into each session's view, so one huge schema costs
 * every listing). An array is not a tool, though a Struct would look inside it for a name.
 */
export const ToolFromPage = (maxBytes = Number.POSITIVE_INFINITY) =>
  Schema.compose(
    JsonObject.annotations(rejects("not-an-object", "a tool must be an object")),
    Number.isFinite(maxBytes)
      ? Tool.pipe(Schema.filter((tool) => {
        // The frame it came in was depth-checked, so this cannot recurse too deep.
        const bytes = utf8Length(JSON.stringify(tool))
        return bytes <= maxBytes || `${bytes} bytes of JSON, over the limit of ${maxBytes} bytes per tool`
      }, { [RejectionKind]: "too-large" }))
      : Tool,
    { strict: false }
  )

/** The kind of the innermost annotated schema along the first issue: the one that refused. */
const kindOf = (issue: ParseResult.ParseIssue): ToolRejection["kind"] | undefined => {
  const next = issue._tag === "Composite"
    ? (Array.isArray(issue.issues) ? issue.issues[0] : issue.issues)
    : "issue" in issue
    ? issue.issue
    : undefined
  const inner = next === undefined ? undefined : kindOf(next)
  if (inner !== undefined || !("ast" in issue)) return inner
  const kind = issue.ast.annotations[RejectionKind]
  return isRejectionKind(kind) ? kind : undefined
}

/** One decoder per limit: a registry has one limit, so this holds one or two. */
const decoders = new Map<number, (u: unknown) => Either.Either<Tool, ParseResult.ParseError>>()

/**
 * Checks one tool from a page against `ToolFromPage(maxBytes)`. The reason goes back to the tab;
 * the rest of the list still registers.
 */
export const validateTool = (u: unknown, maxBytes = Number.POSITIVE_INFINITY): Either.Either<Tool, ToolRejection> => {
  let decode = decoders.get(maxBytes)
  if (decode === undefined) decoders.set(maxBytes, decode = Schema.decodeUnknownEither(ToolFromPage(maxBytes)))
  return Either.mapLeft(decode(u), (error) => {
    const name = isRecord(u) && typeof u["name"] === "string" && u["name"].length > 0 ? u["name"] : undefined
    const why = ParseResult.ArrayFormatter.formatErrorSync(error)[0]?.message ?? "not a tool"
    return rejectTool(kindOf(error.issue) ?? "field-type", name, why)
  })
}

/** `annotations.cache === true`: the tool outlives its tab, under a domain-level name. */
export const isCached = (tool: Tool): boolean => tool.annotations?.["cache"] === true

export const Hello = Schema.Struct({
  tabId: Schema.Int.pipe(Schema.nonNegative()),
  url: Schema.String,
  title: Schema.optional(Schema.String),
  active: Schema.optional(Schema.Boolean)
})
export type Hello = typeof Hello.Type

export const RegisterTools = Schema.Struct({
  tools: Schema.Array(Schema.Unknown),
  tabUrl: Schema.optional(Schema.String)
})
export type RegisterTools = typeof RegisterTools.Type

/** MCP's progress token: a string or a number. */
export const ProgressToken = Schema.Union(Schema.String, Schema.Number)

/** Anything but a JSON object: what a field that only matters as an object may be instead. */
const NotAnObject = Schema.declare((u: unknown): u is unknown => !isRecord(u), { identifier: "NotAnObject" })

/**
 * A `/hub` session's `tools/call` params. `arguments` may be absent or null (none); `_meta` is read
 * only when it is an object, and its `progressToken` must then be a string or a number.
 */
export const ToolsCallParams = Schema.Struct({
  name: Schema.String,
  arguments: Schema.optionalWith(JsonObject, { nullable: true }),
  _meta: Schema.optional(Schema.Union(Schema.Struct({ progressToken: Schema.optional(ProgressToken) }), NotAnObject))
})
export type ToolsCallParams = typeof ToolsCallParams.Type

const decodeToolsCallParamsWithSchema = Schema.decodeUnknownEither(ToolsCallParams)

const isPlainObject = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && Object.getPrototypeOf(u) === Object.prototype
/** A value `_meta` may be as it is (NotAnObject) and the fast path is sure of: JSON's primitives. */
const isPrimitive = (u: unknown) => u === null || typeof u === "string" || typeof u === "number" || typeof u === "boolean"

/**
 * The hand-written twin of `ToolsCallParams`' Schema: what is certainly valid, built as the Schema
 * builds it (only the declared fields, `_meta` kept only as its progress token), or undefined
 * ("not sure": the Schema decides, and words the refusal). The Schema decode was ~6 % of a modern
 * hub call's CPU at 50×10, most of all the registry's own code.
 */
const toolsCallParamsFast = (u: unknown): ToolsCallParams | undefined => {
  if (!isPlainObject(u)) return undefined
  const name = u["name"]
  if (typeof name !== "string") return undefined
  const args = u["arguments"]
  const meta = u["_meta"]
  // An own field set to undefined (never from JSON) is left to the Schema.
  if ((args === undefined && "arguments" in u) || (meta === undefined && "_meta" in u)) return undefined
  if (args !== undefined && args !== null && !isRecord(args)) return undefined
  const params: { -readonly [K in keyof ToolsCallParams]: ToolsCallParams[K] } = { name }
  if (args !== undefined && args !== null) params.arguments = args
  if (meta === undefined) return params
  if (isPrimitive(meta)) {
    params._meta = meta
    return params
  }
  if (!isPlainObject(meta)) return undefined
  const token = meta["progressToken"]
  if (token === undefined) {
    if ("progressToken" in meta) return undefined
    params._meta = {}
  } else if (typeof token === "string" || typeof token === "number") {
    params._meta = { progressToken: token }
  } else {
    return undefined
  }
  return params
}

/** A `tools/call`'s params, decoded as `ToolsCallParams`' Schema decodes them (its hand-written twin first). */
export const decodeToolsCallParams = (u: unknown): Either.Either<ToolsCallParams, ParseResult.ParseError> => {
  const fast = toolsCallParamsFast(u)
  return fast === undefined ? decodeToolsCallParamsWithSchema(u) : Either.right(fast)
}

/** The progress token a `tools/call` asked for, if any. */
export const progressTokenOf = (params: ToolsCallParams): string | number | undefined => {
  const meta = params._meta
  if (!isRecord(meta)) return undefined
  const token = meta["progressToken"]
  return typeof token === "string" || typeof token === "number" ? token : undefined
}

/** A `/hub` session's `tools/list` params (missing or not an object: none); a cursor is a page's offset. */
export const ToolsListParams = Schema.Struct({
  cursor: Schema.optional(Schema.String.pipe(Schema.pattern(/^[0-9]+$/)))
})
export type ToolsListParams = typeof ToolsListParams.Type

/**
 * A `/hub` session's `initialize` params, as far as the hub reads them: the client's protocol
 * version, answered with it when supported and with the newest otherwise. The rest (capabilities,
 * clientInfo) is the client's to describe and is not checked.
 */
export const InitializeParams = Schema.Struct({ protocolVersion: Schema.optional(Schema.String) })
export type InitializeParams = typeof InitializeParams.Type

/**
 * `authenticate`'s params, on `/hub` and `/tabs` alike: the token, as `token` or under the names
 * MCP over WebSocket's clients use (`accessToken`, `access_token`). A field of another type makes
 * the message no authentication at all, rather than falling through to the next name.
 */
export const AuthenticateParams = Schema.Struct({
  token: Schema.optional(Schema.String),
  accessToken: Schema.optional(Schema.String),
  access_token: Schema.optional(Schema.String)
})
export type AuthenticateParams = typeof AuthenticateParams.Type

/** The token an `authenticate` message carries, if any. */
export const tokenOf = (params: AuthenticateParams): string | undefined => params.token ?? params.accessToken ?? params.access_token

/** `notifications/cancelled` from a client: a reason that is not a string is dropped, not refused. */
export const CancelledParams = Schema.Struct({
  requestId: Id,
  reason: Schema.optional(Schema.transform(Schema.Unknown, Schema.UndefinedOr(Schema.String), {
    strict: true,
    decode: (u) => (typeof u === "string" ? u : undefined),
    encode: (s) => s
  }))
})
export type CancelledParams = typeof CancelledParams.Type

/** One open tab and its tools (`registry_tabs`, key user.domain.tab), written by the tab's actor. */
export const TabRecord = Schema.Struct({
  user: Schema.String,
  domain: Schema.String,
  tabId: Schema.Number,
  url: Schema.String,
  title: Schema.optional(Schema.String),
  conn: Schema.String,
  edge: Schema.String,
  /** When the user last brought the tab to the front; 0 if never. */
  activatedAt: Schema.Number,
  /** When its tools last changed. */
  updatedAt: Schema.Number,
  tools: Schema.Array(Tool)
})
export type TabRecord = typeof TabRecord.Type

/** A cached tool (`registry_cached_tools`, key user.domain.tool): it survives its tab. */
export const CachedToolRecord = Schema.Struct({
  domain: Schema.String,
  /** The page that registered it: where a new tab is opened when none is. */
  url: Schema.String,
  tool: Tool,
  cachedAt: Schema.Number
})
export type CachedToolRecord = typeof CachedToolRecord.Type

/** What an actor needs to be rebuilt on another replica (`registry_sessions`, keyed by conn). */
export const SessionRecord = Schema.Union(
  Schema.Struct({ role: Schema.Literal("hub"), user: Schema.String, protocolVersion: Schema.optional(Schema.String) }),
  Schema.Struct({ role: Schema.Literal("tab"), user: Schema.String, domain: Schema.String, tabId: Schema.Number })
)
export type SessionRecord = typeof SessionRecord.Type

/**
 * Where a `/hub` call's answer goes: down the session's socket, or on the Streamable HTTP
 * exchange (edge and exchange id) its request came in on, which any replica can answer.
 */
export const ExchangeRef = Schema.Union(
  Schema.Struct({ kind: Schema.Literal("ws") }),
  Schema.Struct({ kind: Schema.Literal("http"), edge: Schema.String, http: Schema.String })
)
export type ExchangeRef = typeof ExchangeRef.Type

/**
 * What a `/hub` session's actor keeps only in memory, handed to the replica that adopts the
 * session when its own stops: its `tools/call`s in flight, so that a tab's late answer still
 * reaches the caller there, and its id counter, so that no new attempt reuses an id in flight.
 */
export const HubHandoff = Schema.Struct({
  role: Schema.Literal("hub"),
  seq: Schema.Number,
  calls: Schema.Array(Schema.Struct({
    id: Id,
    name: Schema.String,
    target: Schema.Struct({ domain: Schema.String, tool: Schema.String, tabId: Schema.optionalWith(Schema.Number, { exact: true }) }),
    args: Schema.Record({ key: Schema.String, value: Schema.Unknown }),
    progressToken: Schema.optional(Schema.Union(Schema.String, Schema.Number)),
    exchange: ExchangeRef,
    attempts: Schema.Number,
    opened: Schema.Boolean,
    phase: Schema.Literal("sent", "opening", "backoff"),
    /** The attempt in flight, and the tab it went to. */
    mapped: Schema.optional(Schema.String),
    tab: Schema.optional(Schema.Struct({ conn: Schema.String, edge: Schema.String, domain: Schema.String, tabId: Schema.Number }))
  })),
  /**
   * A Streamable HTTP session's events: the epoch and count its event ids go on from, those kept
   * for resumption, and the GET stream that is open (its edge and exchange), which stays open.
   */
  stream: Schema.optional(Schema.Struct({
    epoch: Schema.String,
    seq: Schema.Number,
    events: Schema.Array(Schema.Struct({ id: Schema.String, seq: Schema.Number, at: Schema.Number, data: Schema.String })),
    open: Schema.optional(Schema.Struct({ edge: Schema.String, exchange: Schema.String }))
  }))
})
export type HubHandoff = typeof HubHandoff.Type
export type HttpStreamState = NonNullable<HubHandoff["stream"]>

/** A task's status (ext-tasks); `input_required` never happens here, since a tab asks nothing of the client. */
export const TaskStatus = Schema.Literal("working", "completed", "failed", "cancelled")
export type TaskStatus = typeof TaskStatus.Type

/**
 * One MCP 2026-07-28 task (the `io.modelcontextprotocol/tasks` extension) in the tasks bucket,
 * under its owner: what `tasks/get` answers on any replica, and what another replica needs to run
 * the call again when the one running it is gone (`runner` absent or not alive).
 */
export const TaskRecord = Schema.Struct({
  taskId: Schema.String,
  owner: Schema.String,
  status: TaskStatus,
  statusMessage: Schema.optional(Schema.String),
  /** Epoch milliseconds. */
  createdAt: Schema.Number,
  lastUpdatedAt: Schema.Number,
  ttlMs: Schema.Number,
  /** The `tools/call` the task stands for, as the client sent it. */
  call: Schema.Struct({ name: Schema.String, arguments: Schema.optional(Schema.Record({ key: Schema.String, value: Schema.Unknown })) }),
  /** The registry replica running the call; absent once that replica stopped without an answer. */
  runner: Schema.optional(Schema.String),
  /** How many times the call was sent on its way (more than 1: it was run again after its replica stopped). */
  runs: Schema.Number,
  /** A completed task's `CallToolResult`. */
  result: Schema.optional(Schema.Record({ key: Schema.String, value: Schema.Unknown })),
  /** A failed task's JSON-RPC error. */
  error: Schema.optional(Schema.Struct({ code: Schema.Number, message: Schema.String, data: Schema.optional(Schema.Unknown) }))
})
export type TaskRecord = typeof TaskRecord.Type

/** The params of `tasks/get`, `tasks/update` and `tasks/cancel`. */
export const TaskParams = Schema.Struct({ taskId: Schema.String })

// --- the registry's peer protocol: what its actors say to each other --------------------------

/**
 * Tab actor → hub actor: a response, progress or cancellation the tab sent for one of the hub's
 * calls, routed by the id the hub gave the attempt (`<hub conn>:<n>`), with the tab's own conn so
 * that the hub takes answers only from the tab the attempt went to. One per answer, so a plain
 * tagged struct: a class instance costs microseconds to construct, an object literal nothing.
 */
export const FromTab = Schema.TaggedStruct("FromTab", {
  tab: Schema.String,
  /** The tab's response, or its `notifications/progress` or `notifications/cancelled`. */
  message: Schema.Union(JsonRpcResponse, Notification)
})
export type FromTab = typeof FromTab.Type

/** A `/hub` session's actor to itself: its user's view changed outside its mailbox. */
export class Wake extends Schema.TaggedClass<Wake>()("Wake", {}) {}

/**
 * Every message between the registry's actors. All are told: a call's attempt goes down the tab's
 * socket and its answer comes back by the id it carries, which still finds the hub's actor after
 * either side was handed to another replica, where an ask's reply would not. The one request the
 * registry makes, opening a tab, is the router's (`Proxy.InternalRequest`).
 */
export const RegistryPeer = Schema.Union(FromTab, Wake)
export type RegistryPeer = typeof RegistryPeer.Type
