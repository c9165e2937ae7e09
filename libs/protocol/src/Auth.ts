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

/** The auth service checked the token and refused it; `reason` says why (expired, bad signature...). */
export class TokenRefused extends Schema.TaggedError<TokenRefused>()("TokenRefused", { reason: Schema.String }) {}

/** Any service → the auth service (`auth.verify`, its queue group): check a token; its claims come back. */
export class Verify extends Schema.TaggedRequest<Verify>()("Verify", {
  failure: TokenRefused,
  success: Claims,
  payload: { token: Schema.String }
}) {}

/** What the auth service is asked. */
export const AuthPeer = Schema.Union(Verify)
export type AuthPeer = typeof AuthPeer.Type
