/**
 * How other services verify a token: a request to the auth service over the bus. Answers are
 * kept briefly per token, since a reconnecting client, and a Streamable HTTP client with every
 * request, presents the same token again and again.
 */
import { Bus, Peer, Subjects } from "@switchboard/bus"
import { Auth } from "@switchboard/protocol"
import * as Context from "effect/Context"
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"

/** The token was checked and refused. */
export class AuthFailed extends Data.TaggedError("AuthFailed")<{ readonly reason: string }> {
  override get message() {
    return this.reason
  }
}

/** Nobody could check the token (no auth service, or it timed out). */
export class AuthUnavailable extends Data.TaggedError("AuthUnavailable")<{ readonly reason: string; readonly cause?: unknown }> {
  override get message() {
    return this.reason
  }
}

export interface AuthClientShape {
  readonly verify: (token: string) => Effect.Effect<Auth.Claims, AuthFailed | AuthUnavailable>
  /**
   * The claims of a token verified moments ago and not expired since, without waiting: a hot path
   * (an HTTP request per call) checks this first and goes to `verify` only when it says nothing.
   */
  readonly known: (token: string) => Auth.Claims | undefined
}

export class AuthClient extends Context.Tag("@switchboard/auth/AuthClient")<AuthClient, AuthClientShape>() {}

/** What the auth service is asked. */
const authPeers = Peer.protocol(Auth.AuthPeer)

const GOOD_FOR = 30_000
const BAD_FOR = 5_000
const CAPACITY = 10_000

/** What the auth service said of a token, and until when that answer is kept. */
interface Verdict {
  readonly verdict: Either.Either<Auth.Claims, AuthFailed>
  readonly until: number
}

export const layer: Layer.Layer<AuthClient, never, Bus.Bus> = Layer.scoped(
  AuthClient,
  Effect.gen(function*() {
    const bus = yield* Bus.Bus
    const ask = (token: string) =>
      authPeers.callOn(bus, Subjects.authVerify, new Auth.Verify({ token }), { timeout: "3 seconds" }).pipe(
        Effect.catchTags({
          TokenRefused: (e) => new AuthFailed({ reason: e.reason }),
          PeerTimeout: (e) => new AuthUnavailable({ reason: "auth service unavailable (no answer in time)", cause: e }),
          PeerUnavailable: (e) =>
            new AuthUnavailable({
              reason: e.reason === "Malformed" ? "malformed auth reply" : `auth service unavailable (${e.reason === "NoResponders" ? "NoResponders" : "bus failed"})`,
              cause: e
            })
        })
      )
    // Only verdicts are kept, never "unavailable": a good one for 30 s, a refusal for 5 s, and a
    // kept token is still checked against its own expiry. Expired verdicts are swept every 30 s,
    // since every token ever presented (each participant of a busy room has its own) would
    // otherwise stay until the next time it is asked for.
    const verdicts = new Map<string, Verdict>()
    const sweep = Effect.sync(() => {
      const now = Date.now()
      for (const [token, v] of verdicts) if (v.until <= now) verdicts.delete(token)
    })
    yield* sweep.pipe(Effect.repeat(Schedule.spaced("30 seconds")), Effect.forkScoped)
    const keep = (token: string, verdict: Either.Either<Auth.Claims, AuthFailed>) => {
      if (verdicts.size >= CAPACITY) verdicts.clear()
      verdicts.set(token, { verdict, until: Date.now() + (Either.isRight(verdict) ? GOOD_FOR : BAD_FOR) })
    }
    const expired = (claims: Auth.Claims) => claims.exp !== undefined && claims.exp * 1000 <= Date.now()

    const known = (token: string) => {
      const v = verdicts.get(token)
      if (v === undefined || v.until <= Date.now() || Either.isLeft(v.verdict) || expired(v.verdict.right)) return undefined
      return v.verdict.right
    }
    const verify = (token: string) =>
      Effect.suspend(() => {
        const v = verdicts.get(token)
        const verdict = v !== undefined && v.until > Date.now()
          ? Effect.succeed(v.verdict)
          : Effect.tap(Effect.either(ask(token)), (answer) =>
            Effect.sync(() => {
              if (Either.isRight(answer)) keep(token, Either.right(answer.right))
              else if (answer.left._tag === "AuthFailed") keep(token, Either.left(answer.left))
            }))
        return Effect.flatMap(verdict, (answer) => {
          if (Either.isLeft(answer)) return Effect.fail(answer.left)
          if (!expired(answer.right)) return Effect.succeed(answer.right)
          verdicts.delete(token)
          return Effect.fail(new AuthFailed({ reason: "token expired" }))
        })
      })
    return { verify, known }
  })
)
