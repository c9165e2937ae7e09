/**
 * Token verification as deployed: HS256 with a shared secret, and RS256 against a JWKS served over
 * HTTP with issuer and audience checks. Expiry and `nbf` are honoured.
 */
import { describe, expect, it } from "@effect/vitest"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Effect from "effect/Effect"
import type * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import { decodeJwt, exportJWK, generateKeyPair, SignJWT } from "jose"
import * as Http from "node:http"
import * as Tokens from "../src/Tokens.ts"

const withEnv = (env: Record<string, string>) => Layer.setConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env))))
const verify = (env: Record<string, string>, token: string) =>
  Effect.flatMap(Tokens.Tokens, (t) => Effect.either(t.verify(token))).pipe(Effect.provide(Tokens.layer.pipe(Layer.provide(withEnv(env)))))
const issue = (env: Record<string, string>, options: Tokens.IssueOptions) =>
  Effect.flatMap(Tokens.Tokens, (t) => Effect.either(t.issue(options))).pipe(Effect.provide(Tokens.layer.pipe(Layer.provide(withEnv(env)))))

const SECRET = "a-secret-long-enough-for-hs256-tokens"
/** An HS256 token with exactly these claims (no `sub` unless given). */
const signed = (claims: Record<string, unknown>) =>
  Effect.promise(() => new SignJWT(claims).setProtectedHeader({ alg: "HS256" }).setExpirationTime("5m").sign(new TextEncoder().encode(SECRET)))
const userOf = (env: Record<string, string>, claims: Record<string, unknown>) =>
  Effect.flatMap(signed(claims), (token) => verify(env, token)).pipe(
    Effect.map((r) => (r._tag === "Right" ? { user: r.right.sub } : { refused: r.left.reason }))
  )

/** A JWKS endpoint on loopback, for as long as the scope lives. */
const jwksServer = (jwks: object) =>
  Effect.acquireRelease(
    Effect.async<Http.Server>((resume) => {
      const server = Http.createServer((_req, res) => {
        res.writeHead(200, { "content-type": "application/json" })
        res.end(JSON.stringify(jwks))
      })
      server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
    }),
    (server) => Effect.async<void>((resume) => void server.close(() => resume(Effect.void)))
  ).pipe(Effect.map((server) => `http://127.0.0.1:${(server.address() as { port: number }).port}/jwks.json`))

describe("tokens", () => {
  it.scopedLive("verifies HS256 tokens it issued, and refuses expired, not-yet-valid and foreign ones", () =>
    Effect.gen(function*() {
      const env = { SWITCHBOARD_JWT_SECRET: "a-secret-long-enough-for-hs256-tokens" }
      const issued = yield* Effect.flatMap(Tokens.Tokens, (t) =>
        t.issue({ sub: "alice", privilege: "restricted", topics: ["lobby"], admin: true })
      ).pipe(Effect.provide(Tokens.layer.pipe(Layer.provide(withEnv(env)))))
      const ok = yield* verify(env, issued)
      expect(ok._tag === "Right" && ok.right).toMatchObject({ sub: "alice", privilege: "restricted", topics: ["lobby"], admin: true })

      const key = new TextEncoder().encode(env.SWITCHBOARD_JWT_SECRET)
      const now = Math.floor(Date.now() / 1000)
      const expired = yield* Effect.promise(() => new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject("alice").setExpirationTime(now - 10).sign(key))
      const early = yield* Effect.promise(() =>
        new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject("alice").setNotBefore(now + 60).setExpirationTime("5m").sign(key)
      )
      const foreign = yield* Effect.promise(() =>
        new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject("alice").setExpirationTime("5m").sign(
          new TextEncoder().encode("another-secret-entirely-different")
        )
      )
      const noSub = yield* Effect.promise(() => new SignJWT({ privilege: "full" }).setProtectedHeader({ alg: "HS256" }).setExpirationTime("5m").sign(key))
      const reasons = yield* Effect.forEach([expired, early, foreign, noSub, "not.a.jwt"], (t) => verify(env, t))
      expect(reasons.map((r) => (r._tag === "Left" ? r.left.reason : "accepted"))).toEqual([
        "token expired",
        'claim nbf invalid: "nbf" claim timestamp check failed',
        "signature verification failed",
        "token has no user claim (sub or user_id)",
        "malformed token"
      ])
    }))

  it.scopedLive("verifies RS256 tokens against a JWKS URL with issuer and audience checks", () =>
    Effect.gen(function*() {
      const { privateKey, publicKey } = yield* Effect.promise(() => generateKeyPair("RS256"))
      const jwk = { ...(yield* Effect.promise(() => exportJWK(publicKey))), kid: "k1", alg: "RS256", use: "sig" }
      const url = yield* jwksServer({ keys: [jwk] })
      const env = { SWITCHBOARD_JWKS_URL: url, SWITCHBOARD_JWT_ISSUER: "https://issuer.example", SWITCHBOARD_JWT_AUDIENCE: "switchboard" }
      const sign = (iss: string, aud: string, alg = "RS256") =>
        Effect.promise(() =>
          new SignJWT({}).setProtectedHeader({ alg, kid: "k1" }).setSubject("bob").setIssuer(iss).setAudience(aud).setExpirationTime("5m").sign(privateKey)
        )
      const good = yield* verify(env, yield* sign("https://issuer.example", "switchboard"))
      expect(good._tag === "Right" && good.right.sub).toBe("bob")
      const wrongIssuer = yield* verify(env, yield* sign("https://evil.example", "switchboard"))
      expect(wrongIssuer._tag === "Left" && wrongIssuer.left.reason).toBe('claim iss invalid: unexpected "iss" claim value')
      const wrongAudience = yield* verify(env, yield* sign("https://issuer.example", "someone-else"))
      expect(wrongAudience._tag === "Left" && wrongAudience.left.reason).toBe('claim aud invalid: unexpected "aud" claim value')
      // An HS256 token made with any secret is not accepted where a JWKS is configured.
      const hs = yield* Effect.promise(() =>
        new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject("bob").setExpirationTime("5m").sign(new TextEncoder().encode("x".repeat(32)))
      )
      expect((yield* verify(env, hs))._tag).toBe("Left")
    }))
})

// The MCP Proxy Protocol's peers put the user in `user_id`; everything past auth reads `sub`.
describe("the user claim", () => {
  const uuid = "83898119-db4f-4848-9d27-ea328b73a4df"

  it.effect("is sub, else user_id, by default", () =>
    Effect.gen(function*() {
      const env = { SWITCHBOARD_JWT_SECRET: SECRET }
      expect(yield* userOf(env, { user_id: uuid, connection_url: "wss://x" })).toEqual({ user: uuid })
      expect(yield* userOf(env, { sub: "alice", user_id: uuid })).toEqual({ user: "alice" })
      expect(yield* userOf(env, { privilege: "full" })).toEqual({ refused: "token has no user claim (sub or user_id)" })
      // A user claim that is there but unusable refuses the token rather than falling through to the next.
      expect(yield* userOf(env, { sub: "", user_id: uuid })).toEqual({ refused: "claim sub invalid: the user must be a non-empty string" })
      expect(yield* userOf(env, { user_id: 42 })).toEqual({ refused: "claim user_id invalid: the user must be a non-empty string" })
    }))

  it.effect("is SWITCHBOARD_JWT_USER_CLAIM when set, then sub, then user_id", () =>
    Effect.gen(function*() {
      const env = { SWITCHBOARD_JWT_SECRET: SECRET, SWITCHBOARD_JWT_USER_CLAIM: "uid" }
      expect(yield* userOf(env, { uid: "carol", sub: "alice", user_id: uuid })).toEqual({ user: "carol" })
      expect(yield* userOf(env, { sub: "alice", user_id: uuid })).toEqual({ user: "alice" })
      expect(yield* userOf(env, { user_id: uuid })).toEqual({ user: uuid })
      expect(yield* userOf(env, { topics: ["lobby"] })).toEqual({ refused: "token has no user claim (uid, sub or user_id)" })
    }))

  it.effect("names the claim that is malformed, now that a missing sub is no longer the only reason", () =>
    Effect.gen(function*() {
      const env = { SWITCHBOARD_JWT_SECRET: SECRET }
      const bad = yield* userOf(env, { sub: "alice", privilege: "root" })
      expect("refused" in bad && bad.refused).toMatch(/^claim privilege invalid: /)
    }))

  it.effect("issues extra claims, refuses reserved ones, and refuses a token with no user", () =>
    Effect.gen(function*() {
      const env = { SWITCHBOARD_JWT_SECRET: SECRET }
      const peer = yield* issue(env, { claims: { user_id: uuid, connection_url: "wss://switchboard.example/mcp" } })
      expect(peer._tag === "Right" && decodeJwt(peer.right)).toMatchObject({ user_id: uuid, connection_url: "wss://switchboard.example/mcp" })
      expect(peer._tag === "Right" && decodeJwt(peer.right).sub).toBeUndefined()
      const verified = yield* verify(env, peer._tag === "Right" ? peer.right : "")
      expect(verified._tag === "Right" && verified.right.sub).toBe(uuid)

      const reserved = yield* issue(env, { sub: "alice", claims: { exp: 1, nbf: 1 } })
      expect(reserved._tag === "Left" && reserved.left.reason).toBe("reserved claim exp or nbf cannot be set as an extra claim")
      const nobody = yield* issue(env, { claims: { connection_url: "wss://x" } })
      expect(nobody._tag === "Left" && nobody.left.reason).toBe("token has no user claim (sub or user_id)")
    }))
})

// A token without `exp` is valid for as long as its key: a leaked one, forever.
describe("a token's lifetime", () => {
  const key = new TextEncoder().encode(SECRET)
  const now = () => Math.floor(Date.now() / 1000)
  /** An HS256 token for alice with exactly these registered claims (seconds since the epoch). */
  const lasting = (times: { readonly iat?: number; readonly exp?: number }) =>
    Effect.promise(() => {
      const jwt = new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject("alice")
      if (times.iat !== undefined) jwt.setIssuedAt(times.iat)
      if (times.exp !== undefined) jwt.setExpirationTime(times.exp)
      return jwt.sign(key)
    })
  const outcome = (env: Record<string, string>, times: { readonly iat?: number; readonly exp?: number }) =>
    Effect.flatMap(lasting(times), (token) => verify({ SWITCHBOARD_JWT_SECRET: SECRET, ...env }, token)).pipe(
      Effect.map((r) => (r._tag === "Right" ? "accepted" : r.left.reason))
    )

  it.effect("must have exp unless SWITCHBOARD_JWT_REQUIRE_EXP=false", () =>
    Effect.gen(function*() {
      expect(yield* outcome({}, { iat: now() })).toBe("token has no expiry (exp claim)")
      expect(yield* outcome({}, {})).toBe("token has no expiry (exp claim)")
      expect(yield* outcome({ SWITCHBOARD_JWT_REQUIRE_EXP: "false" }, { iat: now() })).toBe("accepted")
      expect(yield* outcome({}, { iat: now(), exp: now() + 60 })).toBe("accepted")
    }))

  it.effect("is at most SWITCHBOARD_JWT_MAX_LIFETIME: exp - iat, or exp - now without iat or with a later one", () =>
    Effect.gen(function*() {
      const max = { SWITCHBOARD_JWT_MAX_LIFETIME: "1h" }
      const t = now()
      expect(yield* outcome(max, { iat: t, exp: t + 3600 })).toBe("accepted")
      expect(yield* outcome(max, { iat: t, exp: t + 2 * 3600 })).toBe("token lifetime 2h (exp - iat) is longer than the 1h allowed")
      // Issued long ago with a long life: what counts is what it was issued for, not what is left.
      expect(yield* outcome(max, { iat: t - 30 * 86400, exp: t + 60 })).toBe("token lifetime 30d 1m (exp - iat) is longer than the 1h allowed")
      expect(yield* outcome(max, { exp: t + 30 * 60 })).toBe("accepted")
      // Counted from now, a second or so after `t`.
      expect(yield* outcome(max, { exp: t + 3 * 3600 })).toMatch(/^token lifetime (3h|2h 59m 5\ds) \(exp - now\) is longer than the 1h allowed$/)
      // Dated in the future, a token does not get a longer life.
      expect(yield* outcome(max, { iat: t + 3 * 3600, exp: t + 3 * 3600 + 60 })).toMatch(
        /^token lifetime (3h 1m|3h 5\ds) \(exp - now\) is longer than the 1h allowed$/
      )
      expect(yield* outcome({ ...max, SWITCHBOARD_JWT_REQUIRE_EXP: "false" }, { iat: t })).toBe(
        "token has no expiry (exp claim), and a token may live at most 1h"
      )
    }))

  it.effect("issues within the maximum: an hour by default or the maximum if shorter, and refuses a longer ttl", () =>
    Effect.gen(function*() {
      const plain = yield* issue({ SWITCHBOARD_JWT_SECRET: SECRET }, { sub: "alice" })
      const life = (token: Either.Either<string, Tokens.InvalidToken>) =>
        token._tag === "Right" ? (decodeJwt(token.right).exp ?? 0) - (decodeJwt(token.right).iat ?? 0) : token.left.reason
      expect(life(plain)).toBe(3600)
      const env = { SWITCHBOARD_JWT_SECRET: SECRET, SWITCHBOARD_JWT_MAX_LIFETIME: "15m" }
      const short = yield* issue(env, { sub: "alice" })
      expect(life(short)).toBe(900)
      expect((yield* verify(env, short._tag === "Right" ? short.right : ""))._tag).toBe("Right")
      expect(life(yield* issue(env, { sub: "alice", ttl: "15 minutes" }))).toBe(900)
      expect(life(yield* issue(env, { sub: "alice", ttl: "2 hours" }))).toBe("ttl 2h is longer than SWITCHBOARD_JWT_MAX_LIFETIME (15m)")
    }))
})
