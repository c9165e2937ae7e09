/**
 * What the auth service says about a token. The claims are the JWT's, narrowed to what Switchboard
 * reads: `sub` is the user and isolation boundary; MCPx reads `privilege`, `topics` and `admin`.
 * `sub` here is the user as the auth service resolved it, so it may come from the token's
 * `user_id` (the MCP Proxy Protocol's name) or a configured claim; nothing else re-reads the JWT.
 */
import * as Schema from "effect/Schema"

export const Privilege = Schema.Literal("full", "restricted")
export type Privilege = typeof Privilege.Type

export const Claims = Schema.Struct({
  sub: Schema.NonEmptyString,
  exp: Schema.optional(Schema.Number),
  iat: Schema.optional(Schema.Number),
  privilege: Schema.optional(Privilege),
  topics: Schema.optional(Schema.Array(Schema.String)),
  admin: Schema.optional(Schema.Boolean)
})
export type Claims = typeof Claims.Type

/** The body of a request on `auth.verify` is the raw token; this is the reply. */
export const VerifyReply = Schema.Union(
  Schema.Struct({ ok: Schema.Literal(true), claims: Claims }),
  Schema.Struct({ ok: Schema.Literal(false), error: Schema.String })
)
export type VerifyReply = typeof VerifyReply.Type
