/** What a tab and the log hear about rejected tools stays small however many there are. */
import { describe, expect, it } from "@effect/vitest"
import { Registry } from "@switchboard/protocol"
import * as Either from "effect/Either"
import * as Rejections from "../src/Rejections.ts"

const many = (n: number) => Array.from({ length: n }, (_, i) => Registry.rejectTool("over-limit", `t${i}`, "over the limit of 256 tools per tab"))

describe("tool rejections", () => {
  it("quotes every reason of a short list", () => {
    const rs = [Registry.rejectTool("no-name", undefined, "a tool needs a non-empty string name"), ...many(2)]
    expect(Rejections.forTab(rs)).toEqual({
      rejected: ["a tool needs a non-empty string name", 'tool "t0": over the limit of 256 tools per tab', 'tool "t1": over the limit of 256 tools per tab'],
      rejectedCount: 3,
      rejectedByKind: { "no-name": 1, "over-limit": 2 }
    })
    expect(Rejections.forTab([])).toEqual({ rejected: [] })
  })

  it("counts a long list by kind, and quotes only its first reasons", () => {
    const rs = many(10_000)
    const answer = Rejections.forTab(rs)
    expect(answer.rejected).toHaveLength(Rejections.QuotedInAnswer)
    expect(answer.rejectedCount).toBe(10_000)
    expect(JSON.stringify(answer).length).toBeLessThan(2_048)
    const line = Rejections.logLine(rs)
    expect(line).toMatch(/^rejected 10000 tool\(s\) \(over-limit: 10000\): tool "t0": .*; and 9995 more$/)
    expect(line.length).toBeLessThan(512)
  })

  it("cuts long names in reasons", () => {
    const tool = Registry.validateTool({ name: "n".repeat(128), inputSchema: { type: "array" } })
    if (Either.isRight(tool)) throw new Error("expected a rejection")
    expect(tool.left).toMatchObject({ kind: "input-schema", name: "n".repeat(40) })
    expect(tool.left.reason.length).toBeLessThan(120)
  })

  it("rejects a tool over the byte limit, counting UTF-8 bytes", () => {
    const small = { name: "t", inputSchema: { type: "object" } }
    expect(Either.isRight(Registry.validateTool(small, 100))).toBe(true)
    const big = Registry.validateTool({ ...small, description: "é".repeat(40) }, 100)
    expect(Either.isLeft(big) && big.left).toMatchObject({ kind: "too-large", reason: 'tool "t": 141 bytes of JSON, over the limit of 100 bytes per tool' })
    expect(Registry.utf8Length("aé€😀")).toBe(Buffer.byteLength("aé€😀"))
  })

  it("gives each malformed tool the reason of the first field that is wrong, and keeps only known fields", () => {
    const reason = (u: unknown) => Either.match(Registry.validateTool(u), { onLeft: (r) => `${r.kind}: ${r.reason}`, onRight: () => "accepted" })
    const ok = { name: "t", inputSchema: { type: "object" } }
    expect(reason("t")).toBe("not-an-object: a tool must be an object")
    expect(reason([ok])).toBe("not-an-object: a tool must be an object")
    expect(reason({ inputSchema: { type: "object" } })).toBe("no-name: a tool needs a non-empty string name")
    expect(reason({ ...ok, name: "" })).toBe("no-name: a tool needs a non-empty string name")
    expect(reason({ ...ok, name: 7 })).toBe("no-name: a tool needs a non-empty string name")
    expect(reason({ ...ok, name: "n".repeat(129) })).toMatch(/^long-name: tool "n{40}"…: the name is longer than 128 characters$/)
    expect(reason({ name: "t" })).toBe('input-schema: tool "t": inputSchema must be a JSON Schema with type "object"')
    expect(reason({ name: "t", inputSchema: [] })).toBe('input-schema: tool "t": inputSchema must be a JSON Schema with type "object"')
    // inputSchema is checked before the other fields, whatever order the page wrote them in.
    expect(reason({ title: 1, name: "t", inputSchema: { type: "string" } })).toBe('input-schema: tool "t": inputSchema must be a JSON Schema with type "object"')
    expect(reason({ ...ok, title: 1 })).toBe('field-type: tool "t": title must be a string')
    expect(reason({ ...ok, description: null })).toBe('field-type: tool "t": description must be a string')
    expect(reason({ ...ok, outputSchema: "x" })).toBe('field-type: tool "t": outputSchema must be an object')
    expect(reason({ ...ok, annotations: [] })).toBe('field-type: tool "t": annotations must be an object')
    const iconsWhy = 'field-type: tool "t": icons must be an array of {src: string, mimeType?, sizes?, theme?}'
    expect(reason({ ...ok, icons: "https://x/i.png" })).toBe(iconsWhy)
    expect(reason({ ...ok, icons: [{ src: 1 }] })).toBe(iconsWhy)
    expect(reason({ ...ok, icons: [{ src: "https://x/i.png", theme: "blue" }] })).toBe(iconsWhy)
    expect(Registry.validateTool({ ...ok, title: "T", extra: { big: true }, annotations: { cache: true } })).toEqual(
      Either.right({ name: "t", inputSchema: { type: "object" }, title: "T", annotations: { cache: true } })
    )
    // MCP 2025-11-25's icons are kept as the page gave them; an icon's unknown fields are not.
    const icons = [{ src: "https://x/i.png", mimeType: "image/png", sizes: ["48x48"], theme: "light" }]
    expect(Registry.validateTool({ ...ok, icons: [{ ...icons[0], extra: 1 }] })).toEqual(Either.right({ ...ok, icons }))
  })

  it("rejects a tool whose x-mcp-header a client on Streamable HTTP would have to drop (MCP 2026-07-28), saying which and why", () => {
    const reason = (properties: Record<string, unknown>, extra: Record<string, unknown> = {}) =>
      Either.match(Registry.validateTool({ name: "t", inputSchema: { type: "object", properties, ...extra } }), { onLeft: (r) => `${r.kind}: ${r.reason}`, onRight: () => "accepted" })
    const region = { type: "string", "x-mcp-header": "Region" }
    expect(reason({ region, nested: { type: "object", properties: { on: { type: "boolean", "x-mcp-header": "On" } } }, n: { type: "integer", "x-mcp-header": "N" } })).toBe("accepted")
    // A property named x-mcp-header, or the key inside a default, annotates nothing.
    expect(reason({ "x-mcp-header": { type: "string" }, d: { type: "object", default: { "x-mcp-header": 1 } } })).toBe("accepted")
    expect(reason({ region: { type: "string", "x-mcp-header": "" } })).toBe('input-schema: tool "t": inputSchema: x-mcp-header on property region must be a non-empty string')
    expect(reason({ region: { type: "string", "x-mcp-header": "Re gion" } })).toBe(
      'input-schema: tool "t": inputSchema: x-mcp-header "Re gion" on property region is not an HTTP token (RFC 9110: no spaces, control characters or delimiters)'
    )
    expect(reason({ region: { type: "string", "x-mcp-header": "A\r\nB" } })).toMatch(/is not an HTTP token/)
    expect(reason({ region, zone: { type: "string", "x-mcp-header": "REGION" } })).toBe(
      'input-schema: tool "t": inputSchema: x-mcp-header "REGION" on property zone repeats "Region": names must differ ignoring case'
    )
    expect(reason({ size: { type: "number", "x-mcp-header": "Size" } })).toBe('input-schema: tool "t": inputSchema: x-mcp-header "Size" on property size needs type string, integer or boolean, not "number"')
    expect(reason({ o: { type: "object", "x-mcp-header": "O" } })).toMatch(/needs type string, integer or boolean, not "object"$/)
    expect(reason({ a: { type: "array", "x-mcp-header": "A" } })).toMatch(/needs type string, integer or boolean, not "array"$/)
    expect(reason({ u: { "x-mcp-header": "U" } })).toMatch(/needs type string, integer or boolean, not "none"$/)
    const unreachable = /x-mcp-header on .* is not statically reachable: only a chain of "properties" may lead to it/
    expect(reason({ list: { type: "array", items: { type: "string", "x-mcp-header": "Item" } } })).toMatch(unreachable)
    expect(reason({ one: { oneOf: [{ type: "string", "x-mcp-header": "One" }] } })).toMatch(unreachable)
    expect(reason({}, { $defs: { r: { type: "string", "x-mcp-header": "R" } } })).toMatch(unreachable)
    expect(reason({}, { "x-mcp-header": "Root" })).toMatch(/x-mcp-header on the schema's root is not statically reachable/)
  })
})
