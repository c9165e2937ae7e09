/** The `/hub` request params the registry decodes: what they accept is what the hub accepted by hand before. */
import { describe, expect, it } from "@effect/vitest"
import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { CancelledParams, decodeToolsCallParams, progressTokenOf, ToolsCallParams, ToolsListParams } from "../src/Registry.ts"
import { absent, record, random } from "./Generated.ts"

const call = Schema.decodeUnknownEither(ToolsCallParams)
const list = Schema.decodeUnknownEither(ToolsListParams)
const cancelled = Schema.decodeUnknownEither(CancelledParams)

describe("tools/call params", () => {
  it("take a name, arguments that are an object (absent or null: none), and a string or number progress token", () => {
    expect(Either.map(call({ name: "t", arguments: { a: 1 } }), (p) => p.arguments)).toEqual(Either.right({ a: 1 }))
    expect(Either.map(call({ name: "t", arguments: null }), (p) => p.arguments)).toEqual(Either.right(undefined))
    expect(Either.map(call({ name: "t", _meta: { progressToken: 7 } }), progressTokenOf)).toEqual(Either.right(7))
    expect(Either.map(call({ name: "t", _meta: { progressToken: "p" } }), progressTokenOf)).toEqual(Either.right("p"))
    // `_meta` that is not an object carries no token, and is no reason to refuse the call.
    expect(Either.map(call({ name: "t", _meta: "x" }), progressTokenOf)).toEqual(Either.right(undefined))
  })

  it("refuse what the hub answers with Invalid params", () => {
    for (const bad of [undefined, [], "t", { arguments: {} }, { name: 1 }, { name: "t", arguments: [] }, { name: "t", arguments: 1 }, { name: "t", _meta: { progressToken: true } }]) {
      expect(Either.isLeft(call(bad))).toBe(true)
    }
  })
})

const callPools: Record<string, ReadonlyArray<unknown>> = {
  name: [absent, "t", "t", "", 1, null, undefined],
  arguments: [absent, absent, {}, { a: { b: [1] } }, null, [], "x", 0, undefined, new Date(0)],
  _meta: [absent, absent, {}, { progressToken: 1 }, { progressToken: "p", other: 1 }, { progressToken: true }, { progressToken: undefined }, { progressToken: null }, "x", 5, null, false, [], undefined, new Date(0)],
  other: [absent, absent, "kept out"]
}

describe("tools/call params, fast path", () => {
  it("agrees with the Schema on generated values, and on the values above", () => {
    const next = random(20261127)
    const outcome = (e: Either.Either<ToolsCallParams, unknown>) => (Either.isRight(e) ? { right: e.right } : "left")
    const values: Array<unknown> = [undefined, null, [], "t", 1, Object.create(null), { name: "t", arguments: null }]
    for (let i = 0; i < 2000; i++) values.push(record(next, callPools))
    for (const value of values) {
      expect(outcome(decodeToolsCallParams(value)), String(JSON.stringify(value))).toStrictEqual(outcome(call(value)))
      const text = JSON.stringify(value)
      if (text !== undefined) expect(outcome(decodeToolsCallParams(JSON.parse(text))), text).toStrictEqual(outcome(call(JSON.parse(text))))
    }
  })
})

describe("tools/list params", () => {
  it("take a cursor of digits only", () => {
    expect(list({})).toEqual(Either.right({}))
    expect(list({ cursor: "12" })).toEqual(Either.right({ cursor: "12" }))
    for (const bad of [{ cursor: "" }, { cursor: "-1" }, { cursor: "1e3" }, { cursor: 3 }, { cursor: null }]) expect(Either.isLeft(list(bad))).toBe(true)
  })
})

describe("notifications/cancelled params", () => {
  it("name the request by string or number id, and drop a reason that is not a string", () => {
    expect(cancelled({ requestId: 3, reason: "stop" })).toEqual(Either.right({ requestId: 3, reason: "stop" }))
    expect(Either.map(cancelled({ requestId: "a", reason: { toString: 1 } }), (p) => p.reason)).toEqual(Either.right(undefined))
    expect(Either.isLeft(cancelled({ requestId: true }))).toBe(true)
    expect(Either.isLeft(cancelled(undefined))).toBe(true)
  })
})
