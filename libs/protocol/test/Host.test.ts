/**
 * The edge's `Open`, as it goes on the wire: the hand-written encoder writes what the Schema
 * writes, byte for byte, for every shape of event an edge or a Streamable HTTP session sends.
 */
import { describe, expect, it } from "@effect/vitest"
import * as Schema from "effect/Schema"
import type { OpenEvent } from "../src/Edge.ts"
import { encodeOpen, Open } from "../src/Host.ts"

const withSchema = Schema.encodeSync(Schema.parseJson(Open))

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
  { path: "/mcp", query: {}, openedAt: 3, claims: { sub: "carol", privilege: "full", admin: true }, transport: "http" },
  // Fields the Schema does not declare are left out, by both.
  { path: "/tabs", query: {}, openedAt: 4, extra: "dropped", claims: { sub: "dave", jti: "dropped" } } as unknown as OpenEvent
]

describe("Host.encodeOpen: the edge's open, as the Schema writes it", () => {
  it.each(events)("%j", (event) => {
    const open = new Open({ conn: "c-1", edge: "edge-1", event }, true)
    expect(encodeOpen(open)).toBe(withSchema(open))
  })

  it("what it writes decodes to the open it was given", () => {
    const open = new Open({ conn: "c-2", edge: "edge-2", event: events[3]! })
    expect(Schema.decodeUnknownSync(Schema.parseJson(Open))(encodeOpen(open))).toStrictEqual(open)
  })
})
