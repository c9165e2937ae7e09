/**
 * Token verification and (for development) issuing, with `jose`. HS256 with a shared secret by
 * default; a JWKS URL with issuer and audience checks in production. Expiry and `nbf` are checked
 * by `jwtVerify` itself; a token must have an expiry (unless told otherwise), and may be made to
 * live no longer than a maximum. Whichever claim names the user, verified claims carry it as `sub`.
 */
import { Auth, Settings } from "@switchboard/protocol"
import * as Context from "effect/Context"
import * as Data from "effect/Data"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as ParseResult from "effect/ParseResult"
import * as Redacted from "effect/Redacted"
import * as Schema from "effect/Schema"
import { createRemoteJWKSet, errors, type JWTPayload, jwtVerify, type JWTVerifyOptions, SignJWT } from "jose"
import { randomBytes } from "node:crypto"
import * as AuthConfig from "./Config.ts"

export class InvalidToken extends Data.TaggedError("InvalidToken")<{ readonly reason: string; readonly expired?: boolean }> {
  override get message() {
    return this.reason
  }
}

export interface IssueOptions {
  /** The user. May be left out when `claims` carries one that `verify` reads as the user (`user_id`). */
  readonly sub?: string
  readonly ttl?: Duration.DurationInput
  readonly privilege?: Auth.Privilege
  readonly topics?: ReadonlyArray<string>
  readonly admin?: boolean
  /**
   * Any further claims, e.g. `connection_url`, which a Blueprint MCP client needs to enter proxy
   * mode. The registered claims in `reservedClaims` are the issuer's and are refused here.
   */
  readonly claims?: Readonly<Record<string, unknown>>
}

/** Claims that `issue` sets itself (or that only a verifier's configuration decides). */
export const reservedClaims: ReadonlySet<string> = new Set(["sub", "exp", "iat", "nbf", "iss", "aud"])

export interface TokensShape {
  readonly verify: (token: string) => Effect.Effect<Auth.Claims, InvalidToken>
  /**
   * Signs a development token; fails when only a JWKS (no secret) is configured, or when `ttl` is
   * longer than `maxLifetime`. Without `ttl` a token lives an hour, or `maxLifetime` if shorter.
   */
  readonly issue: (options: IssueOptions) => Effect.Effect<string, InvalidToken>
  /** The longest lifetime a token may have (`SWITCHBOARD_JWT_MAX_LIFETIME`), if any. */
  readonly maxLifetime: Option.Option<Duration.Duration>
}

export class Tokens extends Context.Tag("@switchboard/auth/Tokens")<Tokens, TokensShape>() {}

const decodeClaims = Schema.decodeUnknownEither(Auth.Claims)

/** Where the user may be named, in order: the configured claim, then `sub`, then the MCP Proxy Protocol's `user_id`. */
const userClaimsFrom = (configured: string): ReadonlyArray<string> => [...new Set([configured, "sub", "user_id"])]

const listed = (names: ReadonlyArray<string>) =>
  names.length <= 1 ? names.join("") : `${names.slice(0, -1).join(", ")} or ${names[names.length - 1]}`

/**
 * A payload as the rest of Switchboard reads it, with the user in `sub`. The first of `userClaims`
 * that the token carries is the user; if that one is not a non-empty string the token is refused
 * rather than read from a later claim, so a user is never taken from a claim the issuer did not mean.
 */
const claimsOf = (payload: Readonly<Record<string, unknown>>, userClaims: ReadonlyArray<string>): Effect.Effect<Auth.Claims, InvalidToken> => {
  const name = userClaims.find((n) => payload[n] !== undefined)
  if (name === undefined) return Effect.fail(new InvalidToken({ reason: `token has no user claim (${listed(userClaims)})` }))
  const user = payload[name]
  if (typeof user !== "string" || user.length === 0) {
    return Effect.fail(new InvalidToken({ reason: `claim ${name} invalid: the user must be a non-empty string` }))
  }
  return Effect.mapError(decodeClaims({ ...payload, sub: user }), (e) => {
    const first = ParseResult.ArrayFormatter.formatErrorSync(e)[0]
    return new InvalidToken({ reason: first === undefined ? "malformed claims" : `claim ${first.path.join(".")} invalid: ${first.message}` })
  })
}

const explain = (e: unknown): string => {
  if (e instanceof errors.JWTExpired) return "token expired"
  if (e instanceof errors.JWTClaimValidationFailed) return `claim ${e.claim} invalid: ${e.message}`
  if (e instanceof errors.JWSSignatureVerificationFailed) return "signature verification failed"
  if (e instanceof errors.JWSInvalid || e instanceof errors.JWTInvalid) return "malformed token"
  if (e instanceof errors.JOSEAlgNotAllowed) return "algorithm not allowed"
  return e instanceof Error ? e.message : "invalid token"
}

interface KeyOptions {
  readonly secret: Option.Option<Uint8Array>
  readonly jwksUrl: Option.Option<URL>
  readonly issuer: Option.Option<string>
  readonly audience: Option.Option<string>
  /** The claim that names the user before `sub` and `user_id` are tried; `sub` when left out. */
  readonly userClaim?: string
  /** Refuse a token without `exp`, which would be valid forever; true when left out. */
  readonly requireExp?: boolean
  /** Refuse a token meant to live longer than this; no maximum when left out. */
  readonly maxLifetime?: Option.Option<Duration.Duration>
}

const DEFAULT_TTL = Duration.hours(1)

/** A whole number of seconds as a person reads it: `90d`, `36h`, `1h 30m`. */
const seconds = (s: number) => Duration.format(Duration.seconds(s))

/**
 * Why a token's lifetime is refused, if it is: no `exp` where one is required or a maximum is set,
 * or an `exp` further than the maximum from its `iat`, or from now when `iat` is absent or later
 * (an issuer cannot stretch a token's life by dating it in the future).
 */
const lifetimeRefusal = (payload: JWTPayload, requireExp: boolean, maxLifetime: Option.Option<Duration.Duration>): string | undefined => {
  const { exp, iat } = payload
  if (exp === undefined) {
    if (requireExp) return "token has no expiry (exp claim)"
    return Option.isSome(maxLifetime) ? `token has no expiry (exp claim), and a token may live at most ${Duration.format(maxLifetime.value)}` : undefined
  }
  if (Option.isNone(maxLifetime)) return undefined
  const now = Math.floor(Date.now() / 1000)
  const from = iat === undefined ? now : Math.min(iat, now)
  return (exp - from) * 1000 > Duration.toMillis(maxLifetime.value)
    ? `token lifetime ${seconds(exp - from)} (exp - ${iat === undefined || iat > now ? "now" : "iat"}) is longer than the ${Duration.format(maxLifetime.value)} allowed`
    : undefined
}

export const make = (options: KeyOptions): TokensShape => {
  const checks: JWTVerifyOptions = {
    ...Option.match(options.issuer, { onNone: () => ({}), onSome: (issuer) => ({ issuer }) }),
    ...Option.match(options.audience, { onNone: () => ({}), onSome: (audience) => ({ audience }) })
  }
  const userClaims = userClaimsFrom(options.userClaim ?? "sub")
  const requireExp = options.requireExp ?? true
  const maxLifetime = options.maxLifetime ?? Option.none()
  const jwks = Option.map(options.jwksUrl, (url) => createRemoteJWKSet(url))
  const verifyWith = (token: string) =>
    Option.isSome(jwks)
      ? jwtVerify(token, jwks.value, { ...checks, algorithms: ["RS256", "ES256", "EdDSA"] })
      : Option.isSome(options.secret)
      ? jwtVerify(token, options.secret.value, { ...checks, algorithms: ["HS256"] })
      : Promise.reject(new Error("no verification key configured"))

  return {
    verify: (token) =>
      Effect.tryPromise({
        try: () => verifyWith(token),
        catch: (e) => new InvalidToken({ reason: explain(e), expired: e instanceof errors.JWTExpired })
      }).pipe(
        Effect.flatMap(({ payload }) => {
          const refused = lifetimeRefusal(payload, requireExp, maxLifetime)
          return refused === undefined ? claimsOf(payload, userClaims) : Effect.fail(new InvalidToken({ reason: refused }))
        })
      ),
    maxLifetime,
    issue: (o) => {
      const reserved = Object.keys(o.claims ?? {}).filter((k) => reservedClaims.has(k))
      if (reserved.length > 0) {
        return Effect.fail(new InvalidToken({ reason: `reserved claim ${listed(reserved)} cannot be set as an extra claim` }))
      }
      const ttl = o.ttl === undefined
        ? Option.match(maxLifetime, { onNone: () => DEFAULT_TTL, onSome: (max) => Duration.min(DEFAULT_TTL, max) })
        : Duration.decode(o.ttl)
      if (Option.isSome(maxLifetime) && Duration.greaterThan(ttl, maxLifetime.value)) {
        return Effect.fail(
          new InvalidToken({ reason: `ttl ${Duration.format(ttl)} is longer than SWITCHBOARD_JWT_MAX_LIFETIME (${Duration.format(maxLifetime.value)})` })
        )
      }
      const payload = {
        ...o.claims,
        ...(o.privilege === undefined ? {} : { privilege: o.privilege }),
        ...(o.topics === undefined ? {} : { topics: [...o.topics] }),
        ...(o.admin === undefined ? {} : { admin: o.admin })
      }
      const sign = (key: Uint8Array) =>
        Effect.tryPromise({
          try: () => {
            const jwt = new SignJWT(payload)
              .setProtectedHeader({ alg: "HS256", typ: "JWT" })
              .setIssuedAt()
              .setExpirationTime(`${Math.max(1, Math.floor(Duration.toSeconds(ttl)))}s`)
            if (o.sub !== undefined) jwt.setSubject(o.sub)
            Option.map(options.issuer, (i) => jwt.setIssuer(i))
            Option.map(options.audience, (a) => jwt.setAudience(a))
            return jwt.sign(key)
          },
          catch: (e) => new InvalidToken({ reason: explain(e) })
        })
      return Option.match(options.secret, {
        onNone: () => Effect.fail(new InvalidToken({ reason: "no SWITCHBOARD_JWT_SECRET: cannot issue tokens" })),
        onSome: (key) =>
          // Refuse to mint what `verify` would refuse (no user, a malformed MCPx claim).
          claimsOf(o.sub === undefined ? payload : { ...payload, sub: o.sub }, userClaims).pipe(Effect.zipRight(sign(key)))
      })
    }
  }
}

const encoder = new TextEncoder()

const fromConfig = (fallbackSecret: Option.Option<string>) =>
  Effect.gen(function*() {
    const secret = yield* AuthConfig.secret
    const jwksUrl = yield* AuthConfig.jwksUrl
    const key = Option.orElse(Option.map(secret, Redacted.value), () => fallbackSecret)
    if (Option.isNone(key) && Option.isNone(jwksUrl)) {
      return yield* new Settings.StartupFailure({
        message: "set SWITCHBOARD_JWT_SECRET (HS256) or SWITCHBOARD_JWKS_URL: there is no key to verify tokens with"
      })
    }
    if (Option.isSome(secret)) yield* warnIfWeak(Redacted.value(secret.value))
    const requireExp = yield* AuthConfig.requireExp
    if (!requireExp) yield* Effect.logWarning("SWITCHBOARD_JWT_REQUIRE_EXP is false: a token without exp is accepted for as long as its key is")
    return make({
      secret: Option.map(key, (k) => encoder.encode(k)),
      jwksUrl,
      issuer: yield* AuthConfig.issuer,
      audience: yield* AuthConfig.audience,
      userClaim: yield* AuthConfig.userClaim,
      requireExp,
      maxLifetime: yield* AuthConfig.maxLifetime
    })
  })

/** HS256 with a short secret falls to a brute-force search, and then anyone can be anyone. */
const warnIfWeak = (secret: string) => {
  const bytes = Buffer.byteLength(secret)
  return bytes >= 32 && secret !== "change-me" ? Effect.void : Effect.logWarning(
    `SWITCHBOARD_JWT_SECRET is weak (${secret === "change-me" ? "the example value" : `${bytes} bytes`}): whoever guesses it can sign tokens for any user. ` +
      "Use 32 random bytes or more, e.g. `openssl rand -base64 32`."
  )
}

/** Keys from the environment; fails at start when none is configured. */
export const layer: Layer.Layer<Tokens, Settings.StartupFailure> = Layer.effect(Tokens, fromConfig(Option.none()).pipe(Effect.catchTag("ConfigError", Effect.die)))

/**
 * For one-process development: when no key is configured, a random secret is generated and
 * `onGenerated` is told, so that the caller can print a labelled dev token.
 */
export const layerWithDevFallback = (onGenerated: (tokens: TokensShape) => Effect.Effect<void>): Layer.Layer<Tokens> =>
  Layer.effect(
    Tokens,
    Effect.gen(function*() {
      const configured = Option.isSome(yield* AuthConfig.secret) || Option.isSome(yield* AuthConfig.jwksUrl)
      if (configured) return yield* fromConfig(Option.none())
      const tokens = yield* fromConfig(Option.some(randomBytes(32).toString("base64url")))
      yield* onGenerated(tokens)
      return tokens
    }).pipe(Effect.orDie)
  )
