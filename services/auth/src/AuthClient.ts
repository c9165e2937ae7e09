/**
 * How other services verify a token: a request to the auth service over the bus. Answers are
 * cached briefly per token, since a reconnecting client presents the same token again and again.
 */
import { Bus, Subjects } from "@switchboard/bus"
import { Auth } from "@switchboard/protocol"
import * as Cache from "effect/Cache"
import * as Context from "effect/Context"
import * as Data from "effect/Data"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"

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
}

export class AuthClient extends Context.Tag("@switchboard/auth/AuthClient")<AuthClient, AuthClientShape>() {}

const decodeReply = Schema.decodeUnknownEither(Schema.parseJson(Auth.VerifyReply))

export const layer: Layer.Layer<AuthClient, never, Bus.Bus> = Layer.scoped(
  AuthClient,
  Effect.gen(function*() {
    const bus = yield* Bus.Bus
    const ask = (token: string) =>
      bus.request(Subjects.authVerify, token, { timeout: "3 seconds" }).pipe(
        Effect.mapError((e) => new AuthUnavailable({ reason: `auth service unavailable (${e._tag})`, cause: e })),
        Effect.flatMap((m) =>
          Effect.mapError(decodeReply(Bus.text(m)), (e) => new AuthUnavailable({ reason: "malformed auth reply", cause: e }))
        ),
        Effect.flatMap((reply) => (reply.ok ? Effect.succeed(reply.claims) : Effect.fail(new AuthFailed({ reason: reply.error }))))
      )
    // Only verdicts are cached, never "unavailable"; a cached token is re-checked against its own expiry.
    const cache = yield* Cache.makeWith({
      capacity: 10_000,
      lookup: (token: string) => Effect.either(ask(token)),
      timeToLive: (exit) => (exit._tag === "Success" && exit.value._tag === "Right" ? Duration.seconds(30) : Duration.seconds(5))
    })
    // The cache forgets an expired entry only when it is asked for it again or when it is full,
    // so every token ever presented (each participant of a busy room has its own) would stay for
    // as long as 10,000 fit. Emptied every 30 seconds, it holds only the tokens of that long.
    yield* cache.invalidateAll.pipe(Effect.repeat(Schedule.spaced("30 seconds")), Effect.forkScoped)
    const verify = (token: string) =>
      cache.get(token).pipe(
        Effect.flatten,
        Effect.tap((claims) =>
          claims.exp !== undefined && claims.exp * 1000 <= Date.now()
            ? Effect.zipRight(cache.invalidate(token), Effect.fail(new AuthFailed({ reason: "token expired" })))
            : Effect.void
        ),
        Effect.tapError((e) => (e._tag === "AuthUnavailable" ? cache.invalidate(token) : Effect.void))
      )
    return { verify }
  })
)
