/**
 * An asked request's answer on the wire: the fast path for a success says what the whole exit
 * Schema says, for every request class of the protocols and for answers valid and not, refusal
 * and all.
 */
import { Auth, Edge, Host, Proxy } from "@switchboard/protocol"
import { describe, expect, it } from "@effect/vitest"
import * as Cause from "effect/Cause"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as Schema from "effect/Schema"
import * as PeerExit from "../src/PeerExit.ts"

class Refused extends Schema.TaggedError<Refused>()("Refused", { why: Schema.String }) {}
/** A success that is no JSON value as it is: its encoded side differs from its type. */
class When extends Schema.TaggedRequest<When>()("When", { success: Schema.Date, failure: Refused, payload: {} }) {}
class Count extends Schema.TaggedRequest<Count>()("Count", { success: Schema.Int, failure: Refused, payload: {} }) {}

/** An Either of an Exit or a ParseError, as plain data: its error is compared by what it says. */
const outcome = (e: Either.Either<unknown, { readonly message: string }>) => Either.isLeft(e) ? { refused: e.left.message } : { accepted: e.right }

const classes: ReadonlyArray<readonly [string, PeerExit.RequestClass, ReadonlyArray<Exit.Exit<unknown, unknown>>, ReadonlyArray<string>]> = [
  ["Open", Host.Open, [Exit.void, Exit.succeed(5), Exit.fail(new Host.OpenRefused({ code: 1008, reason: "no" }))], [
    `{"_tag":"Success"}`,
    `{"_tag":"Success","value":null}`,
    `{"_tag":"Success","value":{"a":1},"extra":true}`,
    `{"_tag":"Failure","cause":{"_tag":"Fail","error":{"_tag":"OpenRefused","code":4401,"reason":"who"}}}`,
    `{"_tag":"Failure","cause":{"_tag":"Fail","error":{"_tag":"OpenRefused","code":"4401","reason":"who"}}}`
  ]],
  ["Verify", Auth.Verify, [
    Exit.succeed({ sub: "alice", exp: 5, admin: true }),
    Exit.succeed({ sub: "alice", extra: "dropped" }),
    Exit.succeed({ sub: "" }),
    Exit.succeed("not claims"),
    Exit.fail(new Auth.TokenRefused({ reason: "expired" })),
    Exit.die(new Error("boom"))
  ], [
    `{"_tag":"Success","value":{"sub":"alice","exp":5}}`,
    `{"_tag":"Success","value":{"sub":"alice","exp":"5"}}`,
    `{"_tag":"Success","value":{"sub":""}}`,
    `{"_tag":"Success"}`,
    `{"_tag":"Failure","cause":{"_tag":"Fail","error":{"_tag":"TokenRefused","reason":"expired"}}}`,
    `{"_tag":"Failure","cause":{"_tag":"Die","defect":"boom"}}`
  ]],
  ["Adopt", Host.Adopt, [Exit.succeed("replica-1"), Exit.succeed(7), Exit.fail(new Host.AdoptRefused({ reason: "full" }))], [
    `{"_tag":"Success","value":"replica-1"}`,
    `{"_tag":"Success","value":7}`
  ]],
  ["HttpForward", Edge.HttpForward as unknown as PeerExit.RequestClass, [], []],
  ["Attach", Proxy.Attach, [], []],
  ["When", When, [Exit.succeed(new Date(0)), Exit.succeed("1970"), Exit.succeed(new Date(Number.NaN))], [
    `{"_tag":"Success","value":"1970-01-01T00:00:00.000Z"}`,
    `{"_tag":"Success","value":"not a date"}`,
    `{"_tag":"Success","value":0}`
  ]],
  ["Count", Count, [Exit.succeed(3), Exit.succeed(3.5), Exit.succeed(BigInt(3)), Exit.interrupt(Cause.empty as never)], [
    `{"_tag":"Success","value":3}`,
    `{"_tag":"Success","value":3.5}`
  ]]
]

/** Exits any class must encode as its Schema does. */
const common = [Exit.die("defect"), Exit.succeed(undefined), Exit.succeed({ nested: [1, 2] })]
/** Texts any class must read as its Schema does: no JSON, no object, no known tag. */
const garbled = [``, `{`, `null`, `[]`, `"Success"`, `5`, `{}`, `{"_tag":"success"}`, `{"_tag":"Failure"}`, `{"_tag":"Failure","cause":{"_tag":"Fail"}}`]

describe("PeerExit: the fast path agrees with the exit Schema", () => {
  for (const [name, cls, exits, texts] of classes) {
    const fast = PeerExit.ofClass(cls)
    const reference = PeerExit.withSchema(cls)

    it.each([...exits, ...common])(`${name} encodes exit %#`, (exit) => {
      expect(outcome(fast.encode(exit))).toStrictEqual(outcome(reference.encode(exit)))
    })

    it.each([...texts, ...garbled])(`${name} decodes %s`, (text) => {
      expect(outcome(fast.decode(text))).toStrictEqual(outcome(reference.decode(text)))
    })

    it(`${name}: what it encodes, it decodes`, () => {
      for (const exit of exits) {
        const encoded = reference.encode(exit)
        if (Either.isRight(encoded)) expect(outcome(fast.decode(encoded.right))).toStrictEqual(outcome(reference.decode(encoded.right)))
      }
    })
  }

  it("a request's codec is its class's, made once", () => {
    const open = new Host.Open({ conn: "c", edge: "e", event: { path: "/tabs", query: {}, openedAt: 0 } }, true)
    expect(PeerExit.ofRequest(open)).toBe(PeerExit.ofClass(Host.Open))
    expect(PeerExit.ofClass(Host.Open)).not.toBe(PeerExit.ofClass(Host.Adopt))
  })

  it("an empty success is the Open's answer as the edge reads it", () => {
    const codec = PeerExit.ofClass(Host.Open)
    expect(codec.encode(Exit.void)).toStrictEqual(Either.right(`{"_tag":"Success"}`))
    expect(Either.map(codec.decode(`{"_tag":"Success"}`), Exit.isSuccess)).toStrictEqual(Either.right(true))
  })
})
