/** MCP 2026-07-28's Mcp-Param-* headers against a tools/call's arguments: the spec's Server Validation table. */
import { describe, expect, it } from "@effect/vitest"
import * as ParamHeaders from "../src/ParamHeaders.ts"

const schema = {
  type: "object",
  properties: {
    region: { type: "string", "x-mcp-header": "Region" },
    count: { type: "integer", "x-mcp-header": "Count" },
    dry: { type: "boolean", "x-mcp-header": "Dry" },
    where: { type: "object", properties: { zone: { type: ["string", "null"], "x-mcp-header": "Zone" } } },
    query: { type: "string" }
  }
}
const headers = ParamHeaders.of(schema)
const check = (args: unknown, received: Record<string, string>) => ParamHeaders.mismatch(headers, args, received)

describe("Mcp-Param-* headers", () => {
  it("are found along properties only, with their paths", () => {
    expect(headers).toEqual([
      { name: "Region", path: ["region"] },
      { name: "Count", path: ["count"] },
      { name: "Dry", path: ["dry"] },
      { name: "Zone", path: ["where", "zone"] }
    ])
    expect(ParamHeaders.of(schema)).toBe(headers)
  })

  it("agree with the body: a string as is, an integer numerically, a boolean in lowercase, Base64 decoded; an absent or null value has none", () => {
    expect(check({ region: "us-west1", count: 42, dry: false, where: { zone: "b" }, query: "q" }, { region: "us-west1", count: "42.0", dry: "false", zone: "b" })).toBeUndefined()
    expect(check({ region: "Hello, 世界" }, { region: "=?base64?SGVsbG8sIOS4lueVjA==?=" })).toBeUndefined()
    expect(check({ where: { zone: null } }, {})).toBeUndefined()
    expect(check(undefined, {})).toBeUndefined()
    // Headers the tool does not declare are not checked.
    expect(check({}, { other: "x" })).toBeUndefined()
  })

  it("say what is wrong, naming the header", () => {
    expect(check({ region: "us-west1" }, {})).toBe("Header mismatch: Mcp-Param-Region header is missing, and arguments.region has a value")
    expect(check({ region: "us-west1" }, { region: "eu-west1" })).toBe('Header mismatch: Mcp-Param-Region header value "eu-west1" does not match body value "us-west1"')
    expect(check({ count: 42 }, { count: "43" })).toBe('Header mismatch: Mcp-Param-Count header value "43" does not match body value "42"')
    expect(check({ dry: true }, { dry: "True" })).toBe('Header mismatch: Mcp-Param-Dry header value "True" does not match body value "true"')
    expect(check({ where: { zone: "a" } }, { zone: "=?base64?Yg==?=" })).toBe('Header mismatch: Mcp-Param-Zone header value "b" does not match body value "a"')
    expect(check({ region: "é" }, { region: "\u00c3\u00a9" })).toBe("Header mismatch: Mcp-Param-Region header has invalid characters; a value outside visible ASCII is sent as =?base64?…?=")
    expect(check({ region: "x" }, { region: "=?base64?!!?=" })).toBe("Header mismatch: Mcp-Param-Region header is not valid =?base64?…?= encoding")
    expect(check({}, { region: "us-west1" })).toBe("Header mismatch: Mcp-Param-Region header is present, but arguments.region has no value")
  })
})
