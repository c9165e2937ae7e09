/**
 * MCP 2026-07-28's `Mcp-Param-{Name}` headers (`basic/transports/streamable-http.mdx`, "Custom
 * Headers from Tool Parameters"): a tool marks arguments with `x-mcp-header` in its `inputSchema`,
 * and a client on Streamable HTTP mirrors their values into headers, so that a load balancer may
 * route on them. What a valid annotation is, and whether a request's headers say what its body does.
 */
import { decodeHeaderValue } from "./Modern.ts"

/** One annotated argument: its header's name part as the tool declared it, and where its value sits in `arguments`. */
export interface ParamHeader {
  readonly name: string
  readonly path: ReadonlyArray<string>
}

/** The prefix of the headers, lowercase: Node gives header names lowercase. */
export const Prefix = "mcp-param-"

/** RFC 9110's `token` (`1*tchar`), which a header's name must be. */
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/
/** What a header's value may hold unencoded (RFC 9110 field values, ASCII only). */
const FIELD_VALUE = /^[\x20-\x7E\t]*$/
const PRIMITIVES = new Set(["string", "integer", "boolean"])
/** Keywords whose values are data, not schemas: an `x-mcp-header` key inside them annotates nothing. */
const DATA_KEYWORDS = new Set(["const", "enum", "default", "examples"])

const isRecord = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && !Array.isArray(u)

const where = (path: ReadonlyArray<string>) => (path.length === 0 ? "the schema's root" : `property ${path.join(".")}`)

/** The one primitive a property's `type` names (with `"null"` beside it, or not); undefined for any other. */
const primitiveOf = (type: unknown): string | undefined => {
  if (typeof type === "string") return PRIMITIVES.has(type) ? type : undefined
  if (!Array.isArray(type)) return undefined
  const others = type.filter((t) => t !== "null")
  return others.length === 1 && typeof others[0] === "string" && PRIMITIVES.has(others[0]) ? others[0] : undefined
}

/**
 * The annotated arguments of an `inputSchema`, or why its annotations are invalid (the spec's
 * constraints, which make the whole tool invalid): empty, not a token, a duplicate ignoring case,
 * on a property that is not a string, integer or boolean, or not reachable from the root through
 * `properties` alone (under `items`, `oneOf`, `$ref`, ...).
 */
export const declared = (inputSchema: Record<string, unknown>): { readonly headers: ReadonlyArray<ParamHeader> } | { readonly invalid: string } => {
  const headers: Array<ParamHeader> = []
  const seen = new Map<string, string>()
  const visit = (node: unknown, path: ReadonlyArray<string>, reachable: boolean): string | undefined => {
    if (Array.isArray(node)) {
      for (const item of node) {
        const invalid = visit(item, path, false)
        if (invalid !== undefined) return invalid
      }
      return undefined
    }
    if (!isRecord(node)) return undefined
    for (const [key, value] of Object.entries(node)) {
      if (DATA_KEYWORDS.has(key)) continue
      if (key === "x-mcp-header") {
        if (!reachable || path.length === 0) {
          return `x-mcp-header on ${where(path)} is not statically reachable: only a chain of "properties" may lead to it (not items, oneOf/anyOf/allOf/not, if/then/else or $ref)`
        }
        if (typeof value !== "string" || value.length === 0) return `x-mcp-header on ${where(path)} must be a non-empty string`
        if (!TOKEN.test(value)) return `x-mcp-header ${JSON.stringify(value)} on ${where(path)} is not an HTTP token (RFC 9110: no spaces, control characters or delimiters)`
        if (primitiveOf(node["type"]) === undefined) {
          return `x-mcp-header ${JSON.stringify(value)} on ${where(path)} needs type string, integer or boolean, not ${JSON.stringify(node["type"] ?? "none")}`
        }
        const prior = seen.get(value.toLowerCase())
        if (prior !== undefined) return `x-mcp-header ${JSON.stringify(value)} on ${where(path)} repeats ${JSON.stringify(prior)}: names must differ ignoring case`
        seen.set(value.toLowerCase(), value)
        headers.push({ name: value, path })
      } else if (key === "properties" && isRecord(value)) {
        for (const [property, schema] of Object.entries(value)) {
          const invalid = visit(schema, [...path, property], reachable)
          if (invalid !== undefined) return invalid
        }
      } else {
        const invalid = visit(value, path, false)
        if (invalid !== undefined) return invalid
      }
    }
    return undefined
  }
  const invalid = visit(inputSchema, [], true)
  return invalid === undefined ? { headers } : { invalid }
}

/** Why a tool's `inputSchema` may not be served on Streamable HTTP; undefined when its `x-mcp-header`s are valid (or it has none). */
export const invalidAnnotation = (inputSchema: Record<string, unknown>): string | undefined => {
  // Most tools have none; the walk is for those that do.
  if (!JSON.stringify(inputSchema).includes("\"x-mcp-header\"")) return undefined
  const result = declared(inputSchema)
  return "invalid" in result ? result.invalid : undefined
}

// A tool's schema is one object for as long as its view holds it: each is walked once.
const cache = new WeakMap<object, ReadonlyArray<ParamHeader>>()

/** The annotated arguments of a registered tool (its annotations were checked at registration). */
export const of = (inputSchema: Record<string, unknown>): ReadonlyArray<ParamHeader> => {
  const cached = cache.get(inputSchema)
  if (cached !== undefined) return cached
  const result = declared(inputSchema)
  const headers = "headers" in result ? result.headers : []
  cache.set(inputSchema, headers)
  return headers
}

const valueAt = (args: unknown, path: ReadonlyArray<string>): unknown => {
  let node = args
  for (const key of path) {
    if (!isRecord(node)) return undefined
    node = node[key]
  }
  return node
}

/** A body value as the spec converts it for its header: a string as it is, an integer in decimal, a boolean in lowercase. */
const matches = (header: string, value: unknown): boolean => {
  if (typeof value === "string") return header === value
  if (typeof value === "boolean") return header === String(value)
  // "servers SHOULD compare the header value and the body value numerically" (42.0 is 42).
  if (typeof value === "number") return header.trim() !== "" && Number(header) === value
  return false
}

const shown = (s: string) => (s.length > 60 ? `${JSON.stringify(s.slice(0, 60))}…` : JSON.stringify(s))

/**
 * Why a `tools/call`'s `Mcp-Param-*` headers do not say what its arguments do (the spec's Server
 * Validation: status 400, `HeaderMismatch`); undefined when they agree. `received` holds each
 * header the edge saw, by the lowercase name after the prefix; headers the tool does not declare
 * are not ours to judge. A header for an argument the body does not have is refused too: a proxy
 * may have routed on a value the tool never gets.
 */
export const mismatch = (headers: ReadonlyArray<ParamHeader>, args: unknown, received: Readonly<Record<string, string>>): string | undefined => {
  for (const { name, path } of headers) {
    const header = `Mcp-Param-${name}`
    const raw = received[name.toLowerCase()]
    const value = valueAt(args, path)
    const absent = value === undefined || value === null
    if (raw === undefined) {
      if (absent) continue
      return `Header mismatch: ${header} header is missing, and arguments.${path.join(".")} has a value`
    }
    if (!FIELD_VALUE.test(raw)) return `Header mismatch: ${header} header has invalid characters; a value outside visible ASCII is sent as =?base64?…?=`
    const decoded = decodeHeaderValue(raw)
    if (decoded === undefined) return `Header mismatch: ${header} header is not valid =?base64?…?= encoding`
    if (absent) return `Header mismatch: ${header} header is present, but arguments.${path.join(".")} has no value`
    if (!matches(decoded, value)) {
      return `Header mismatch: ${header} header value ${shown(decoded)} does not match body value ${shown(typeof value === "string" ? value : JSON.stringify(value))}`
    }
  }
  return undefined
}

const LOWER_M = Prefix.charCodeAt(0)

/**
 * A request's `Mcp-Param-*` headers as one bus header's value: JSON of each value by the lowercase
 * name after the prefix (header names are case-insensitive); undefined when it has none.
 */
export const encodeReceived = (headers: Readonly<Record<string, string | ReadonlyArray<string> | undefined>>): string | undefined => {
  let received: Record<string, string> | undefined
  // Every modern tools/call comes through here with a dozen headers and most often none of ours: a
  // look at the first letter spares each an entry array and a lowercase copy (issue 28).
  for (const name in headers) {
    if ((name.charCodeAt(0) | 0x20) !== LOWER_M || name.length < Prefix.length || !name.toLowerCase().startsWith(Prefix)) continue
    const value = headers[name]
    if (value === undefined) continue
    received ??= {}
    received[name.slice(Prefix.length).toLowerCase()] = typeof value === "string" ? value : value.join(", ")
  }
  return received === undefined ? undefined : JSON.stringify(received)
}

/** {@link encodeReceived}'s value read back; none, or one that is not such JSON, is no headers. */
export const decodeReceived = (text: string | undefined): Readonly<Record<string, string>> => {
  if (text === undefined) return {}
  try {
    const parsed: unknown = JSON.parse(text)
    return isRecord(parsed) && Object.values(parsed).every((v) => typeof v === "string") ? parsed as Record<string, string> : {}
  } catch {
    return {}
  }
}
