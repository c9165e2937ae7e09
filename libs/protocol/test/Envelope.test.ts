// The envelope between edge and services: every variant round-trips through its header codec, the
// hand-written fast path agrees with the Schemas on valid and invalid headers, and a missing or
// garbled header is refused in words that name it, never read as "" or NaN.
import { describe, expect, it } from "@effect/vitest"
import * as Either from "effect/Either"
import {
  decodeEdgeIn,
  decodeEdgeInWithSchema,
  decodeEdgeOut,
  decodeEdgeOutWithSchema,
  decodeStateless,
  decodeStatelessWithSchema,
  type EdgeIn,
  type EdgeOut,
  encodeEdgeIn,
  encodeEdgeInWithSchema,
  encodeEdgeOut,
  encodeEdgeOutWithSchema,
  encodeStateless,
  encodeStatelessWithSchema,
  Header,
  type Headers
} from "../src/Envelope.ts"

/** A received message's headers as the bus adapters read them: an empty value reads as absent. */
const source = (headers: Headers) => ({ header: (name: string) => (headers[name] === "" ? undefined : headers[name]) })
type Outcome<A> = { readonly ok: A } | { readonly refused: string }
const outcome = <A>(e: Either.Either<A, string>): Outcome<A> => (Either.isRight(e) ? { ok: e.right } : { refused: e.left })

const conn = "6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f"
const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

const edgeIns: ReadonlyArray<EdgeIn> = [
  { _tag: "Frame", conn, edge: "e1", limited: false },
  { _tag: "Frame", conn, edge: "e1", user: "alice", limited: true, traceparent },
  { _tag: "Frame", conn, edge: "e1", user: "alice", limited: false, http: "7", httpOp: "stream", lastEventId: "41" },
  { _tag: "Frame", conn, edge: "e1", user: "alice", limited: false, http: "8", httpOp: "stream-closed" },
  { _tag: "Closed", conn, edge: "e1", code: 1000, reason: "bye" },
  { _tag: "Closed", code: 1006, reason: "edge lost" },
  { _tag: "Closed", code: 4001, reason: "" },
  { _tag: "Marker", conn, handoff: "h-1" },
  { _tag: "Peer", kind: "Attach" },
  { _tag: "Peer", kind: "FromTab", traceparent }
]

const edgeOuts: ReadonlyArray<EdgeOut> = [
  { _tag: "Deliver", conn },
  { _tag: "Deliver", conn, traceparent },
  { _tag: "Fanout", conns: [conn, "c2", "c3"] },
  { _tag: "Fanout", conns: ["c2"], traceparent },
  { _tag: "Exchange", conn, http: "3", end: false },
  { _tag: "Exchange", conn, http: "3", end: true, eventId: "9", traceparent },
  { _tag: "Exchange", conn, http: "5", end: true, status: 400 },
  { _tag: "Close", conn, code: 1013, reason: "slow consumer: outbound buffer full" },
  { _tag: "Close", conn, code: 1000, reason: "" },
  { _tag: "Hold", conn, handoff: "h-2" },
  { _tag: "Release", conn, handoff: "h-2" }
]

describe("Envelope: every variant round-trips", () => {
  it.each(edgeIns)("EdgeIn $_tag %#", (m) => {
    const headers = encodeEdgeIn(m)
    expect(headers).toStrictEqual(encodeEdgeInWithSchema(m))
    expect(outcome(decodeEdgeIn(source(headers)))).toStrictEqual({ ok: m })
    expect(outcome(decodeEdgeInWithSchema(headers))).toStrictEqual({ ok: m })
  })

  it.each(edgeOuts)("EdgeOut $_tag %#", (m) => {
    const headers = encodeEdgeOut(m)
    expect(headers).toStrictEqual(encodeEdgeOutWithSchema(m))
    expect(outcome(decodeEdgeOut(source(headers)))).toStrictEqual({ ok: m })
    expect(outcome(decodeEdgeOutWithSchema(headers))).toStrictEqual({ ok: m })
  })

  it.each([{ user: "alice", edge: "e1", http: "12" }, { user: "bob", edge: "e2", http: "1", traceparent }, {
    user: "carol",
    edge: "e3",
    http: "2",
    params: "{\"region\":\"us-west1\"}"
  }])("Stateless %j", (m) => {
    const headers = encodeStateless(m)
    expect(headers).toStrictEqual(encodeStatelessWithSchema(m))
    expect(outcome(decodeStateless(source(headers)))).toStrictEqual({ ok: m })
  })

  it("writes the bytes the edge and services wrote before the envelope, so that versions mix in a rolling restart", () => {
    expect(encodeEdgeOut({ _tag: "Close", conn, code: 1008, reason: "rate limit exceeded" })).toStrictEqual({
      "sb-op": "close",
      "sb-conn": conn,
      "sb-code": "1008",
      "sb-reason": "rate limit exceeded"
    })
    expect(encodeEdgeOut({ _tag: "Fanout", conns: ["a", "b"] })).toStrictEqual({ "sb-op": "deliver", "sb-conns": "a,b" })
    expect(encodeEdgeOut({ _tag: "Exchange", conn, http: "4", end: true })).toStrictEqual({ "sb-op": "deliver", "sb-conn": conn, "sb-http": "4", "sb-http-end": "1" })
    expect(encodeEdgeIn({ _tag: "Frame", conn, edge: "e1", user: "u", limited: true })).toStrictEqual({
      "sb-op": "frame",
      "sb-conn": conn,
      "sb-edge": "e1",
      "sb-user": "u",
      "sb-reason": "rate-limited"
    })
    expect(encodeEdgeIn({ _tag: "Marker", conn, handoff: "h" })).toStrictEqual({ "sb-op": "marker", "sb-conn": conn, "sb-handoff": "h" })
  })
})

// Valid and invalid header sets: each side's fast path must say what its Schema says, refusal and all.
const inputs: ReadonlyArray<Headers> = [
  ...edgeIns.map(encodeEdgeIn),
  ...edgeOuts.map(encodeEdgeOut),
  {},
  { [Header.op]: "" },
  { [Header.op]: "bogus", [Header.conn]: conn },
  { [Header.op]: "frame", [Header.conn]: conn },
  { [Header.op]: "frame", [Header.edge]: "e1" },
  { [Header.op]: "frame", [Header.conn]: "", [Header.edge]: "e1" },
  { [Header.op]: "frame", [Header.conn]: conn, [Header.edge]: "e1", [Header.reason]: "because" },
  { [Header.op]: "frame", [Header.conn]: conn, [Header.edge]: "e1", [Header.httpOp]: "stream-opened" },
  { [Header.op]: "frame", [Header.conn]: conn, [Header.edge]: "e1", [Header.reason]: "" },
  { [Header.op]: "frame", [Header.conn]: conn, [Header.edge]: "e1", "x-extra": "ignored" },
  { [Header.op]: "closed", [Header.conn]: conn },
  { [Header.op]: "closed", [Header.code]: "abc", [Header.reason]: "x" },
  { [Header.op]: "closed", [Header.code]: " 1000" },
  { [Header.op]: "closed", [Header.code]: "0x10" },
  { [Header.op]: "closed", [Header.code]: "1e3" },
  { [Header.op]: "closed", [Header.code]: "-1" },
  { [Header.op]: "closed", [Header.code]: "1000.5" },
  { [Header.op]: "closed", [Header.code]: "1000" },
  { [Header.op]: "marker", [Header.conn]: conn },
  { [Header.op]: "peer" },
  { [Header.op]: "deliver" },
  { [Header.op]: "deliver", [Header.conns]: "" },
  { [Header.op]: "deliver", [Header.conns]: "a,,b" },
  { [Header.op]: "deliver", [Header.http]: "3" },
  { [Header.op]: "deliver", [Header.conn]: conn, [Header.http]: "3", [Header.httpEnd]: "yes" },
  { [Header.op]: "deliver", [Header.conn]: conn, [Header.http]: "3", [Header.httpEnd]: "" },
  { [Header.op]: "deliver", [Header.conn]: conn, [Header.conns]: "a,b" },
  { [Header.op]: "deliver", [Header.conn]: conn, [Header.http]: "3", [Header.httpEnd]: "1", [Header.httpStatus]: "4xx" },
  { [Header.op]: "deliver", [Header.conn]: conn, [Header.http]: "3", [Header.httpEnd]: "1", [Header.httpStatus]: "" },
  { [Header.op]: "close", [Header.conn]: conn },
  { [Header.op]: "close", [Header.code]: "1000" },
  { [Header.op]: "close", [Header.conn]: conn, [Header.code]: "NaN" },
  { [Header.op]: "close", [Header.conn]: conn, [Header.code]: "" },
  { [Header.op]: "hold", [Header.conn]: conn },
  { [Header.op]: "release", [Header.handoff]: "h" },
  { [Header.op]: "hold", [Header.conn]: conn, [Header.handoff]: "h", [Header.code]: "x" }
]
/** The Schemas see what a bus message offers: no empty values. */
const received = (headers: Headers): Headers => Object.fromEntries(Object.entries(headers).filter(([, v]) => v !== ""))

describe("Envelope: the fast path agrees with the Schemas", () => {
  it.each(inputs)("EdgeIn %j", (headers) => {
    expect(outcome(decodeEdgeIn(source(headers)))).toStrictEqual(outcome(decodeEdgeInWithSchema(received(headers))))
  })

  it.each(inputs)("EdgeOut %j", (headers) => {
    expect(outcome(decodeEdgeOut(source(headers)))).toStrictEqual(outcome(decodeEdgeOutWithSchema(received(headers))))
  })

  it.each([
    ...inputs,
    { [Header.user]: "u", [Header.edge]: "e" },
    { [Header.user]: "u", [Header.http]: "1" },
    { [Header.user]: "", [Header.edge]: "e", [Header.http]: "1" },
    { [Header.user]: "u", [Header.edge]: "e", [Header.http]: "1", [Header.traceparent]: "" },
    { [Header.user]: "u", [Header.edge]: "e", [Header.http]: "1", [Header.mcpParams]: "" }
  ])("Stateless %j", (headers) => {
    expect(outcome(decodeStateless(source(headers)))).toStrictEqual(outcome(decodeStatelessWithSchema(received(headers))))
  })
})

describe("Envelope: a missing or garbled header is refused by name", () => {
  const refusalOf = (e: Either.Either<unknown, string>) => (Either.isLeft(e) ? e.left : "accepted")

  it("a close without a code, or with one that is no number, says so instead of closing with NaN", () => {
    expect(refusalOf(decodeEdgeOut(source({ [Header.op]: "close", [Header.conn]: conn })))).toBe(`${Header.code}: is missing`)
    expect(refusalOf(decodeEdgeOut(source({ [Header.op]: "close", [Header.conn]: conn, [Header.code]: "abc" })))).toMatch(/^sb-code: .*"abc"/)
    expect(refusalOf(decodeEdgeIn(source({ [Header.op]: "closed", [Header.code]: "0x10" })))).toMatch(/^sb-code: .*"0x10"/)
  })

  it("a message without a connection names the header, instead of looking up the connection \"\"", () => {
    expect(refusalOf(decodeEdgeOut(source({ [Header.op]: "hold", [Header.handoff]: "h" })))).toBe(`${Header.conn}: is missing`)
    expect(refusalOf(decodeEdgeIn(source({ [Header.op]: "frame", [Header.edge]: "e1" })))).toBe(`${Header.conn}: is missing`)
    expect(refusalOf(decodeEdgeIn(source({ [Header.op]: "marker", [Header.conn]: conn })))).toBe(`${Header.handoff}: is missing`)
  })

  it("a stateless request without its exchange says so", () => {
    expect(refusalOf(decodeStateless(source({ [Header.user]: "u", [Header.edge]: "e" })))).toBe(`${Header.http}: is missing`)
  })

  it("an unknown or missing operation is refused", () => {
    expect(refusalOf(decodeEdgeOut(source({})))).toBe(`${Header.op}: is missing`)
    expect(refusalOf(decodeEdgeIn(source({ [Header.op]: "deliver", [Header.conn]: conn })))).toMatch(/^sb-op: .*"deliver"/)
    expect(refusalOf(decodeEdgeOut(source({ [Header.op]: "frame", [Header.conn]: conn })))).toMatch(/^sb-op: .*"frame"/)
  })

  it("an exchange's delivery with a garbled end is refused, not sent to a socket of that id", () => {
    expect(refusalOf(decodeEdgeOut(source({ [Header.op]: "deliver", [Header.conn]: conn, [Header.http]: "3", [Header.httpEnd]: "yes" })))).toMatch(
      /^sb-http-end: .*"yes"/
    )
  })
})
