/**
 * The edge's `Open`, as it goes on the wire and is read back: the hand-written encoder writes what
 * the Schema writes, byte for byte, for every shape of event an edge or a Streamable HTTP session
 * sends; the hand-written decoder reads what the Schema reads, and leaves to the Schema whatever
 * it refuses or is not sure of.
 */
import { describe, expect, it } from "@effect/vitest"
import * as Either from "effect/Either"
import * as Equal from "effect/Equal"
import * as Schema from "effect/Schema"
import type { OpenEvent } from "../src/Edge.ts"
import { decodeOpenFast, encodeOpen, makeOpen, Open } from "../src/Host.ts"

const withSchema = Schema.encodeSync(Schema.parseJson(Open))
const decodeWithSchema = Schema.decodeUnknownEither(Open)

const events: ReadonlyArray<OpenEvent> = [
  { path: "/tabs", query: {}, openedAt: 1_700_000_000_000 },
  { path: "/v0/ws", query: { room: "r1", participant: "p \"1\"", "": "" }, openedAt: 0.5, origin: "https://example.com", protocol: "mcp" },
  { path: "/extension", query: {}, openedAt: 1, claims: { sub: "alice" } },
  {
    path: "/hub",
    query: { a: "1" },
    openedAt: 2,
    origin: "null",
    claims: { sub: "bob", exp: 3, iat: 1, privilege: "restricted", topics: ["a", "b/ü"], admin: false }
  },
  { path: "/mcp", query: {}, openedAt: 3, claims: { sub: "carol", privilege: "full", admin: true, topics: [] }, transport: "http" },
  // Fields the Schema does not declare are left out, by both.
  { path: "/tabs", query: {}, openedAt: 4, extra: "dropped", claims: { sub: "dave", jti: "dropped" } } as unknown as OpenEvent
]

const open = (event: unknown, fields: Record<string, unknown> = {}) => ({ _tag: "Open", conn: "c-1", edge: "edge-1", event, ...fields })
const valid = { path: "/tabs", query: {}, openedAt: 1 }

/** Parsed JSON the Schema refuses: the fast path must leave every one to it. */
const refused: ReadonlyArray<unknown> = [
  null,
  [],
  "Open",
  {},
  open(valid, { _tag: "Adopt" }),
  open(valid, { conn: 1 }),
  open(valid, { edge: null }),
  open(null),
  open([]),
  open({ ...valid, path: 1 }),
  open({ ...valid, query: [] }),
  open({ ...valid, query: { a: 1 } }),
  open({ ...valid, query: null }),
  open({ ...valid, openedAt: "1" }),
  open({ path: "/tabs", query: {} }),
  open({ ...valid, origin: null }),
  open({ ...valid, protocol: 5 }),
  open({ ...valid, transport: "ws" }),
  open({ ...valid, claims: null }),
  open({ ...valid, claims: [] }),
  open({ ...valid, claims: {} }),
  open({ ...valid, claims: { sub: "" } }),
  open({ ...valid, claims: { sub: 5 } }),
  open({ ...valid, claims: { sub: "u", exp: "5" } }),
  open({ ...valid, claims: { sub: "u", iat: null } }),
  open({ ...valid, claims: { sub: "u", privilege: "root" } }),
  open({ ...valid, claims: { sub: "u", topics: "a" } }),
  open({ ...valid, claims: { sub: "u", topics: ["a", 1] } }),
  open({ ...valid, claims: { sub: "u", admin: "yes" } })
]

/** Parsed JSON the Schema takes but the fast path is not sure of: a query with an own `__proto__` key. */
const unsure: ReadonlyArray<unknown> = [open({ ...valid, query: JSON.parse(`{"__proto__":"x"}`) })]

/** What a decode says, as plain data: the value, or that it refused. */
const outcome = (e: Either.Either<unknown, unknown>) => (Either.isRight(e) ? { accepted: e.right } : "refused")

describe("Host.makeOpen: the instance the Schema class's constructor makes", () => {
  it.each(events)("%j", (event) => {
    const made = makeOpen("c-1", "edge-1", event)
    const constructed = new Open({ conn: "c-1", edge: "edge-1", event }, true)
    expect(Object.getPrototypeOf(made)).toBe(Object.getPrototypeOf(constructed))
    expect(Reflect.ownKeys(made)).toEqual(Reflect.ownKeys(constructed))
    expect(made).toStrictEqual(constructed)
    expect(Equal.equals(made, constructed)).toBe(true)
    expect(Schema.is(Open)(made)).toBe(true)
    expect(withSchema(made)).toBe(withSchema(constructed))
  })
})

describe("Host.encodeOpen: the edge's open, as the Schema writes it", () => {
  it.each(events)("%j", (event) => {
    const value = new Open({ conn: "c-1", edge: "edge-1", event }, true)
    expect(encodeOpen(value)).toBe(withSchema(value))
  })
})

describe("Host.decodeOpenFast: the service's side, as the Schema reads it", () => {
  it.each(events)("takes what an edge writes: %j", (event) => {
    const parsed: unknown = JSON.parse(encodeOpen(new Open({ conn: "c-1", edge: "edge-1", event }, true)))
    const fast = decodeOpenFast(parsed)
    expect(fast).toBeInstanceOf(Open)
    expect(outcome(Either.right(fast))).toStrictEqual(outcome(decodeWithSchema(parsed)))
  })

  it.each(refused)("leaves what the Schema refuses to the Schema: %j", (parsed) => {
    expect(Either.isLeft(decodeWithSchema(parsed))).toBe(true)
    expect(decodeOpenFast(parsed)).toBeUndefined()
  })

  it.each(unsure)("leaves what it is not sure of to the Schema: %j", (parsed) => {
    expect(Either.isRight(decodeWithSchema(parsed))).toBe(true)
    expect(decodeOpenFast(parsed)).toBeUndefined()
  })
})
