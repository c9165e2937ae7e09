/**
 * What the auth service says about a token. The claims are the JWT's, narrowed to what Switchboard
 * reads: `sub` is the user and isolation boundary; MCPx reads `privilege`, `topics` and `admin`.
 * `sub` here is the user as the auth service resolved it, so it may come from the token's
 * `user_id` (the MCP Proxy Protocol's name) or a configured claim; nothing else re-reads the JWT.
 */
import { isBoolean, isNumber, isString } from "effect/Predicate"
import * as Schema from "effect/Schema"
import { isRecord } from "./browser/JsonRpc.ts"
import { optionalField } from "./Json.ts"

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

/**
 * Claims as their Schema encodes them to JSON: the declared fields only, in the Schema's order
 * (JSON.stringify leaves out what is `undefined`). For the hand-written codecs of what carries
 * claims once per connection (`Edge.openEventJson`).
 */
export const claimsJson = (c: Claims): Claims => ({ sub: c.sub, exp: c.exp, iat: c.iat, privilege: c.privilege, topics: c.topics, admin: c.admin })

const isStrings = (u: unknown): u is ReadonlyArray<string> => Array.isArray(u) && u.every(isString)
const isPrivilege = (u: unknown): u is Privilege => u === "full" || u === "restricted"

/**
 * What `Claims`' Schema decodes from parsed JSON, written by hand: `undefined` wherever it is not
 * sure, for the Schema to decode and say why. `Host.test.ts` holds it to the Schema.
 */
export const decodeClaimsFast = (u: unknown): Claims | undefined => {
  if (!isRecord(u)) return undefined
  const { admin, exp, iat, privilege, sub, topics } = u
  if (typeof sub !== "string" || sub === "") return undefined
  const claims: { -readonly [K in keyof Claims]: Claims[K] } = { sub }
  const taken = optionalField(claims, "exp", exp, isNumber) && optionalField(claims, "iat", iat, isNumber) &&
    optionalField(claims, "privilege", privilege, isPrivilege) && optionalField(claims, "topics", topics, isStrings) &&
    optionalField(claims, "admin", admin, isBoolean)
  return taken ? claims : undefined
}

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
