/** Every setting of the auth service, read once. */
import { Settings } from "@switchboard/protocol"
import * as Config from "effect/Config"

export const secret = Config.option(
  Config.redacted("SWITCHBOARD_JWT_SECRET").pipe(
    Config.withDescription("HS256 secret for development tokens. When unset, all-in-one generates one and prints a dev token.")
  )
)
export const jwksUrl = Config.option(
  Config.url("SWITCHBOARD_JWKS_URL").pipe(Config.withDescription("JWKS URL for RS256/ES256 production tokens"))
)
export const issuer = Config.option(Config.string("SWITCHBOARD_JWT_ISSUER").pipe(Config.withDescription("Required `iss` claim")))
export const audience = Config.option(
  Config.string("SWITCHBOARD_JWT_AUDIENCE").pipe(Config.withDescription("Required `aud` claim"))
)
export const userClaim = Config.nonEmptyString("SWITCHBOARD_JWT_USER_CLAIM").pipe(
  Config.withDefault("sub"),
  Config.withDescription(
    "Claim that names the user. The user is the first of this claim, `sub`, `user_id` that the token carries, " +
      "and it must be a non-empty string; a token with none of them is refused. Services see it as `sub`."
  )
)
export const requireExp = Settings.flag(
  "SWITCHBOARD_JWT_REQUIRE_EXP",
  true,
  "Refuse tokens without an `exp` claim, which would otherwise be valid forever; false accepts them"
)
export const maxLifetime = Settings.optionalDuration(
  "SWITCHBOARD_JWT_MAX_LIFETIME",
  "Longest lifetime a token may have (exp - iat, or exp - now without iat), e.g. 24h; unset, no maximum"
)
