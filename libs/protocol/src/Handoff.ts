/**
 * A stopping service replica hands its connections to the others (DESIGN.md, "Failure model"):
 * it asks the service's queue group to adopt each one, then forwards what reached it meanwhile.
 */
import * as Schema from "effect/Schema"
import { OpenEvent } from "./Edge.ts"

/** To the service's `handoff` queue group: adopt this connection, with the state it had in memory. */
export const AdoptRequest = Schema.Struct({
  conn: Schema.String,
  edge: Schema.String,
  open: OpenEvent,
  /** The replica handing it over; the connection's record names it until the adopter takes it. */
  from: Schema.String,
  /** What the actor kept only in memory (requests in flight), as its `onHandoff` gave it. */
  state: Schema.optional(Schema.Unknown)
})
export type AdoptRequest = typeof AdoptRequest.Type

/** The adopter listens on the connection's subject (its mailbox held) and owns its record. */
export const AdoptReply = Schema.Union(
  Schema.Struct({ ok: Schema.Literal(true), replica: Schema.String }),
  Schema.Struct({ ok: Schema.Literal(false), reason: Schema.String })
)
export type AdoptReply = typeof AdoptReply.Type

/** A message the old owner received after the hand-off began, for the adopter to handle first. */
export const ForwardedMessage = Schema.Struct({
  headers: Schema.Record({ key: Schema.String, value: Schema.String }),
  /** base64: a peer message's body may be any bytes. */
  data: Schema.String,
  reply: Schema.optional(Schema.String)
})

/** To the adopter's inbox: the rest of the old owner's mailbox; the adopter then starts its own. */
export const Forward = Schema.Struct({
  conn: Schema.String,
  messages: Schema.Array(ForwardedMessage)
})
export type Forward = typeof Forward.Type
