// Pins what decodeFrame/decodeValue return for valid and invalid frames, down to the text of each
// -32600 reply, and checks that the hand-written fast path agrees with the Schema decoders on
// generated input, so the hot-path optimisation cannot drift from the documented wire types.
import { describe, expect, it } from "@effect/vitest"
import * as Either from "effect/Either"
import { decodeFrame, decodeValue, decodeValueWithSchema, type ErrorResponse, type Incoming } from "../src/JsonRpc.ts"
import { absent, pick, random, record } from "./Generated.ts"

// Plain data rather than Either, so toStrictEqual compares contents (Either's Equal would compare
// the decoded message by reference).
type Outcome = { readonly incoming: Incoming } | { readonly reply: ErrorResponse }
const outcome = (result: Either.Either<Incoming, ErrorResponse>): Outcome =>
  Either.isRight(result) ? { incoming: result.right } : { reply: result.left }

const request = (message: Record<string, unknown>): Outcome => ({ incoming: { _tag: "Request", message } as Incoming })
const notification = (message: Record<string, unknown>): Outcome => ({ incoming: { _tag: "Notification", message } as Incoming })
const response = (message: Record<string, unknown>): Outcome => ({ incoming: { _tag: "Response", message } as Incoming })
const invalid = (id: string | number | null, ...lines: ReadonlyArray<string>): Outcome => ({
  reply: { jsonrpc: "2.0", id, error: { code: -32600, message: `Invalid Request: ${lines.join("\n")}` } }
})
const parseError = (detail: string): Outcome => ({ reply: { jsonrpc: "2.0", id: null, error: { code: -32700, message: `Parse error: ${detail}` } } })
// V8's wording for most syntax errors differs between Node versions; take it from the runtime.
const jsonSyntaxError = (text: string): string => {
  try {
    JSON.parse(text)
  } catch (e) {
    if (e instanceof Error) return e.message
  }
  throw new Error(`expected ${text} to be invalid JSON`)
}

// The root line of each TreeFormatter message: the Schema a frame was checked against.
const requestShape =
  `{ readonly jsonrpc?: "2.0" | undefined; readonly id: string | number; readonly method: string; readonly params?: { readonly [x: string]: unknown } | ReadonlyArray<unknown> | undefined }`
const notificationShape =
  `{ readonly jsonrpc?: "2.0" | undefined; readonly method: string; readonly params?: { readonly [x: string]: unknown } | ReadonlyArray<unknown> | undefined }`
const successShape = `{ readonly jsonrpc?: "2.0" | undefined; readonly id: string | number; readonly result: unknown }`
const errorObjectShape = `{ readonly code: Int; readonly message: string; readonly data?: unknown | undefined }`
const errorShape = `{ readonly jsonrpc?: "2.0" | undefined; readonly id: string | number | null; readonly error: ${errorObjectShape} }`

const badVersion = (actual: string) => [
  `└─ ["jsonrpc"]`,
  `   └─ "2.0" | undefined`,
  `      ├─ Expected "2.0", actual ${actual}`,
  `      └─ Expected undefined, actual ${actual}`
]
const badId = (actual: string) => [
  `└─ ["id"]`,
  `   └─ string | number`,
  `      ├─ Expected string, actual ${actual}`,
  `      └─ Expected number, actual ${actual}`
]
const badParams = (actual: string) => [
  `└─ ["params"]`,
  `   └─ { readonly [x: string]: unknown } | ReadonlyArray<unknown> | undefined`,
  `      ├─ { readonly [x: string]: unknown } | ReadonlyArray<unknown>`,
  `      │  ├─ Expected { readonly [x: string]: unknown }, actual ${actual}`,
  `      │  └─ Expected ReadonlyArray<unknown>, actual ${actual}`,
  `      └─ Expected undefined, actual ${actual}`
]
const badErrorField = (...lines: ReadonlyArray<string>) => [`└─ ["error"]`, `   └─ ${errorObjectShape}`, ...lines]
const notAnInteger = (actual: string) =>
  badErrorField(
    `      └─ ["code"]`,
    `         └─ Int`,
    `            └─ Predicate refinement failure`,
    `               └─ Expected an integer, actual ${actual}`
  )

const cases: ReadonlyArray<{ readonly name: string; readonly frame: string; readonly expected: Outcome }> = [
  // Valid frames
  {
    name: "request with a number id and by-name params",
    frame: `{"jsonrpc":"2.0","id":7,"method":"createTab","params":{"url":"https://example.com"}}`,
    expected: request({ jsonrpc: "2.0", id: 7, method: "createTab", params: { url: "https://example.com" } })
  },
  {
    name: "request with a string id and by-position params",
    frame: `{"jsonrpc":"2.0","id":"req-1","method":"sum","params":[1,2]}`,
    expected: request({ jsonrpc: "2.0", id: "req-1", method: "sum", params: [1, 2] })
  },
  { name: "request with id 0 and no params", frame: `{"jsonrpc":"2.0","id":0,"method":"ping"}`, expected: request({ jsonrpc: "2.0", id: 0, method: "ping" }) },
  { name: "request without jsonrpc and a fractional id", frame: `{"id":-1.5,"method":"ping"}`, expected: request({ id: -1.5, method: "ping" }) },
  // JSON.parse turns an overflowing number into Infinity, and Schema.Number accepts it.
  { name: "request whose id overflows to Infinity", frame: `{"id":1e999,"method":"ping"}`, expected: request({ id: Infinity, method: "ping" }) },
  {
    name: "notification",
    frame: `{"jsonrpc":"2.0","method":"tabUpdated","params":{"tabId":3}}`,
    expected: notification({ jsonrpc: "2.0", method: "tabUpdated", params: { tabId: 3 } })
  },
  { name: "notification without jsonrpc, empty params", frame: `{"method":"heartbeat","params":[]}`, expected: notification({ method: "heartbeat", params: [] }) },
  {
    name: "success response",
    frame: `{"jsonrpc":"2.0","id":7,"result":{"tabId":42}}`,
    expected: response({ jsonrpc: "2.0", id: 7, result: { tabId: 42 } })
  },
  { name: "success response with a null result", frame: `{"id":"x","result":null}`, expected: response({ id: "x", result: null }) },
  {
    name: "error response",
    frame: `{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"Method not found"}}`,
    expected: response({ jsonrpc: "2.0", id: 7, error: { code: -32601, message: "Method not found" } })
  },
  {
    name: "error response with a null id and data",
    frame: `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error","data":{"at":3}}}`,
    expected: response({ jsonrpc: "2.0", id: null, error: { code: -32700, message: "Parse error", data: { at: 3 } } })
  },
  {
    name: "extra fields on a request are preserved",
    frame: `{"jsonrpc":"2.0","id":1,"method":"m","connectionId":"conn-1","meta":{"a":1}}`,
    expected: request({ jsonrpc: "2.0", id: 1, method: "m", connectionId: "conn-1", meta: { a: 1 } })
  },
  {
    name: "extra fields on a response and its error are preserved",
    frame: `{"id":1,"error":{"code":1,"message":"m","retry":true},"connectionId":"c"}`,
    expected: response({ id: 1, error: { code: 1, message: "m", retry: true }, connectionId: "c" })
  },
  { name: "method wins over result", frame: `{"id":1,"method":"m","result":1}`, expected: request({ id: 1, method: "m", result: 1 }) },

  // Wrong jsonrpc
  { name: "request with jsonrpc 1.0", frame: `{"jsonrpc":"1.0","id":1,"method":"m"}`, expected: invalid(1, requestShape, ...badVersion(`"1.0"`)) },
  { name: "notification with a numeric jsonrpc", frame: `{"jsonrpc":2,"method":"m"}`, expected: invalid(null, notificationShape, ...badVersion("2")) },
  { name: "response with a null jsonrpc", frame: `{"jsonrpc":null,"id":"a","result":1}`, expected: invalid("a", successShape, ...badVersion("null")) },

  // Wrong id
  { name: "request with an object id", frame: `{"id":{},"method":"m"}`, expected: invalid(null, requestShape, ...badId("{}")) },
  { name: "request with a boolean id", frame: `{"id":true,"method":"m"}`, expected: invalid(null, requestShape, ...badId("true")) },
  { name: "request with a null id", frame: `{"id":null,"method":"m"}`, expected: invalid(null, requestShape, ...badId("null")) },
  { name: "success response with a null id", frame: `{"id":null,"result":1}`, expected: invalid(null, successShape, ...badId("null")) },
  {
    name: "error response with an array id",
    frame: `{"id":[1],"error":{"code":1,"message":"m"}}`,
    expected: invalid(
      null,
      errorShape,
      `└─ ["id"]`,
      `   └─ string | number | null`,
      `      ├─ string | number`,
      `      │  ├─ Expected string, actual [1]`,
      `      │  └─ Expected number, actual [1]`,
      `      └─ Expected null, actual [1]`
    )
  },
  { name: "success response without an id", frame: `{"result":1}`, expected: invalid(null, successShape, `└─ ["id"]`, `   └─ is missing`) },

  // Wrong method or params
  { name: "request with a numeric method", frame: `{"id":3,"method":5}`, expected: invalid(3, requestShape, `└─ ["method"]`, `   └─ Expected string, actual 5`) },
  { name: "notification with a null method", frame: `{"method":null}`, expected: invalid(null, notificationShape, `└─ ["method"]`, `   └─ Expected string, actual null`) },
  { name: "request with string params", frame: `{"id":4,"method":"m","params":"x"}`, expected: invalid(4, requestShape, ...badParams(`"x"`)) },
  { name: "notification with numeric params", frame: `{"method":"m","params":5}`, expected: invalid(null, notificationShape, ...badParams("5")) },
  { name: "request with null params", frame: `{"id":4,"method":"m","params":null}`, expected: invalid(4, requestShape, ...badParams("null")) },

  // Wrong response shape
  {
    name: "response with both result and error",
    frame: `{"id":5,"result":1,"error":{"code":1,"message":"m"}}`,
    expected: invalid(5, "a response has either result or error, not both")
  },
  { name: "neither method, result nor error", frame: `{"id":6}`, expected: invalid(6, "expected method, result or error") },
  { name: "empty object", frame: `{}`, expected: invalid(null, "expected method, result or error") },
  { name: "error code not an integer", frame: `{"id":8,"error":{"code":1.5,"message":"m"}}`, expected: invalid(8, errorShape, ...notAnInteger("1.5")) },
  {
    name: "error code beyond the safe integers",
    frame: `{"id":8,"error":{"code":9007199254740992,"message":"m"}}`,
    expected: invalid(8, errorShape, ...notAnInteger("9007199254740992"))
  },
  {
    name: "error code a string",
    frame: `{"id":8,"error":{"code":"1","message":"m"}}`,
    expected: invalid(
      8,
      errorShape,
      ...badErrorField(
        `      └─ ["code"]`,
        `         └─ Int`,
        `            └─ From side refinement failure`,
        `               └─ Expected number, actual "1"`
      )
    )
  },
  {
    name: "error without a code",
    frame: `{"id":8,"error":{"message":"m"}}`,
    expected: invalid(8, errorShape, ...badErrorField(`      └─ ["code"]`, `         └─ is missing`))
  },
  {
    name: "error without a message",
    frame: `{"id":8,"error":{"code":1}}`,
    expected: invalid(8, errorShape, ...badErrorField(`      └─ ["message"]`, `         └─ is missing`))
  },
  { name: "null error", frame: `{"id":8,"error":null}`, expected: invalid(8, errorShape, `└─ ["error"]`, `   └─ Expected ${errorObjectShape}, actual null`) },
  { name: "array error", frame: `{"id":8,"error":[]}`, expected: invalid(8, errorShape, `└─ ["error"]`, `   └─ Expected ${errorObjectShape}, actual []`) },
  { name: "string error", frame: `{"id":8,"error":"boom"}`, expected: invalid(8, errorShape, `└─ ["error"]`, `   └─ Expected ${errorObjectShape}, actual "boom"`) },

  // Not an object at all
  { name: "batch", frame: `[{"jsonrpc":"2.0","id":1,"method":"m"}]`, expected: invalid(null, "expected a JSON object") },
  { name: "empty batch", frame: `[]`, expected: invalid(null, "expected a JSON object") },
  { name: "number", frame: `1`, expected: invalid(null, "expected a JSON object") },
  { name: "string", frame: `"str"`, expected: invalid(null, "expected a JSON object") },
  { name: "null", frame: `null`, expected: invalid(null, "expected a JSON object") },
  { name: "boolean", frame: `true`, expected: invalid(null, "expected a JSON object") },

  // Not JSON
  { name: "empty frame", frame: ``, expected: parseError("Unexpected end of JSON input") },
  { name: "unterminated object", frame: `{`, expected: parseError(jsonSyntaxError(`{`)) },
  { name: "trailing comma", frame: `{"id":1,}`, expected: parseError(jsonSyntaxError(`{"id":1,}`)) },
  { name: "bare word", frame: `nope`, expected: parseError(jsonSyntaxError(`nope`)) }
]

describe("JsonRpc.decodeFrame", () => {
  it.each(cases)("$name", ({ expected, frame }) => {
    expect(outcome(decodeFrame(frame))).toStrictEqual(expected)
  })
})

// Each field draws from values near the boundaries of the wire types; `absent` leaves it out.
const pools: Record<string, ReadonlyArray<unknown>> = {
  jsonrpc: [absent, absent, "2.0", "2.0", "2.0", "1.0", 2, null, undefined],
  id: [absent, 1, 0, -7, 1.5, "a", "", null, true, {}, [], NaN, Infinity, undefined, 2 ** 60],
  method: [absent, absent, "m", "tools/call", "", 1, null, undefined],
  params: [absent, {}, { a: 1 }, [], [1, "x"], "s", 3, null, undefined, new Date(0)],
  result: [absent, absent, absent, null, 1, "r", { ok: true }, [], undefined],
  error: [
    absent,
    absent,
    absent,
    { code: -32601, message: "Method not found" },
    { code: 1, message: "m", data: { why: 1 } },
    { code: 1, message: "m", data: undefined, extra: "kept" },
    { code: 1.5, message: "m" },
    { code: 2 ** 53, message: "m" },
    { code: "1", message: "m" },
    { code: 1 },
    { message: "m" },
    null,
    [],
    "e"
  ],
  connectionId: [absent, absent, "conn-1"]
}

const generate = (next: () => number): unknown =>
  next() < 0.04 ? pick(next, [null, 1, "x", true, [], [{ id: 1, method: "m" }]]) : record(next, pools)

describe("JsonRpc fast path", () => {
  it("agrees with the Schema decoders on generated values and frames", () => {
    const next = random(20240611)
    for (let i = 0; i < 600; i++) {
      const value = generate(next)
      expect(outcome(decodeValue(value)), JSON.stringify(value)).toStrictEqual(outcome(decodeValueWithSchema(value)))
      // JSON drops undefined and turns NaN/Infinity into null, so the text path sees other shapes.
      const frame = JSON.stringify(value)
      expect(outcome(decodeFrame(frame)), frame).toStrictEqual(outcome(decodeValueWithSchema(JSON.parse(frame))))
    }
  })
})
