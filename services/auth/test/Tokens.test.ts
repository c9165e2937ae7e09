/**
 * Token verification as deployed: HS256 with a shared secret, and RS256 against a JWKS served over
 * HTTP with issuer and audience checks. Expiry and `nbf` are honoured.
 */
import { describe, expect, it } from "@effect/vitest"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { exportJWK, generateKeyPair, SignJWT } from "jose"
import * as Http from "node:http"
import * as Tokens from "../src/Tokens.ts"

const withEnv = (env: Record<string, string>) => Layer.setConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env))))
const verify = (env: Record<string, string>, token: string) =>
  Effect.flatMap(Tokens.Tokens, (t) => Effect.either(t.verify(token))).pipe(Effect.provide(Tokens.layer.pipe(Layer.provide(withEnv(env)))))

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
      const early = yield* Effect.promise(() => new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject("alice").setNotBefore(now + 60).sign(key))
      const foreign = yield* Effect.promise(() =>
        new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject("alice").sign(new TextEncoder().encode("another-secret-entirely-different"))
      )
      const noSub = yield* Effect.promise(() => new SignJWT({ privilege: "full" }).setProtectedHeader({ alg: "HS256" }).sign(key))
      const reasons = yield* Effect.forEach([expired, early, foreign, noSub, "not.a.jwt"], (t) => verify(env, t))
      expect(reasons.map((r) => (r._tag === "Left" ? r.left.reason : "accepted"))).toEqual([
        "token expired",
        'claim nbf invalid: "nbf" claim timestamp check failed',
        "signature verification failed",
        "token lacks a usable `sub` claim",
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
      const hs = yield* Effect.promise(() => new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject("bob").sign(new TextEncoder().encode("x".repeat(32))))
      expect((yield* verify(env, hs))._tag).toBe("Left")
    }))
})
