/**
 * How other services verify a token: a request to the auth service over the bus. Answers are
 * kept briefly (`Verdicts.ts`), since a reconnecting client, and a Streamable HTTP client with
 * every request, presents the same token again and again.
 */
import { Bus, Peer, Subjects } from "@switchboard/bus"
import { Auth } from "@switchboard/protocol"
import * as Context from "effect/Context"
import * as Data from "effect/Data"
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Verdicts from "./Verdicts.ts"

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
   * `verify` with a callback, for the edge's check of every upgrade: no fiber waits for the auth
   * service (see the Bus port's `unsafeRequest`). `onVerdict` is called once: at once when the
   * verdict is kept, else when the answer comes. The function returned cancels the check.
   */
  readonly unsafeVerify: (token: string, onVerdict: (verdict: Exit.Exit<Auth.Claims, AuthFailed | AuthUnavailable>) => void) => () => void
  /**
   * The claims of a token verified moments ago and not expired since, without waiting: a hot path
   * (an HTTP request per call) checks this first and goes to `verify` only when it says nothing.
   */
  readonly known: (token: string) => Auth.Claims | undefined
}

export class AuthClient extends Context.Tag("@switchboard/auth/AuthClient")<AuthClient, AuthClientShape>() {}

type Verdict = Exit.Exit<Auth.Claims, AuthFailed | AuthUnavailable>
type OnVerdict = (verdict: Verdict) => void

/** One request to the auth service for a token, shared by every caller that presents it meanwhile. */
interface Check {
  readonly waiting: Set<OnVerdict>
  cancel: () => void
}

/** What the auth service is asked. */
const authPeers = Peer.protocol(Auth.AuthPeer)

/**
 * A good verdict is kept 30 s, a refusal 5 s. Refusals have a table of their own, smaller: anyone
 * can present garbage, and a flood of it must not push good users' verdicts out.
 */
const GOOD: Verdicts.Limits = { keepFor: 30_000, maxEntries: 10_000, maxBytes: 8 * 1024 * 1024 }
const REFUSED: Verdicts.Limits = { keepFor: 5_000, maxEntries: 1_000, maxBytes: 256 * 1024 }

/** Digests of good tokens kept by their text (`Verdicts.Digests`). */
const DIGESTS = 256

/** Claims as held in memory take about twice their JSON (UTF-16 strings, object headers). */
const claimsBytes = (claims: Auth.Claims) => 2 * JSON.stringify(claims).length
const reasonBytes = (reason: string) => 2 * reason.length

export const layer: Layer.Layer<AuthClient, never, Bus.Bus> = Layer.scoped(
  AuthClient,
  Effect.gen(function*() {
    const bus = yield* Bus.Bus
    /** Why the auth service's answer is no verdict, as callers read it. */
    const unavailable = (e: Peer.PeerTimeout | Peer.PeerUnavailable) =>
      e._tag === "PeerTimeout"
        ? new AuthUnavailable({ reason: "auth service unavailable (no answer in time)", cause: e })
        : new AuthUnavailable({
          reason: e.reason === "Malformed" ? "malformed auth reply" : `auth service unavailable (${e.reason === "NoResponders" ? "NoResponders" : "bus failed"})`,
          cause: e
        })
    // Only verdicts are kept, never "unavailable", and a kept token is still checked against its
    // own expiry. Expired verdicts are swept every 30 s, since every token ever presented (each
    // participant of a busy room has its own) would otherwise stay until it is asked for again.
    const good = new Verdicts.Verdicts<Auth.Claims>(GOOD, claimsBytes)
    const refused = new Verdicts.Verdicts<string>(REFUSED, reasonBytes)
    yield* Effect.sync(() => {
      good.sweep()
      refused.sweep()
    }).pipe(Effect.repeat(Schedule.spaced("30 seconds")), Effect.forkScoped)
    const expired = (claims: Auth.Claims) => claims.exp !== undefined && claims.exp * 1000 <= Date.now()

    const digests = new Verdicts.Digests(DIGESTS)
    /** The kept good verdict of `token` (whose digest is `key`), unless the token has expired since. */
    const kept = (token: string, key: string) => {
      const claims = good.get(key)
      if (claims === undefined) return undefined
      if (expired(claims)) return void good.delete(key)
      digests.keep(token, key)
      return claims
    }
    const known = (token: string) => kept(token, digests.of(token))
    const noCheck = () => undefined
    /** The check under way for each token digest, and who waits on it; gone once it answers. */
    const checking = new Map<string, Check>()
    /** A waiter that stops waiting; the check itself is cancelled only once nobody waits on it. */
    const leave = (key: string, check: Check, onVerdict: OnVerdict) => {
      if (!check.waiting.delete(onVerdict) || check.waiting.size > 0) return
      if (checking.get(key) === check) checking.delete(key)
      check.cancel()
    }
    const unsafeVerify: AuthClientShape["unsafeVerify"] = (token, onVerdict) => {
      const key = digests.of(token)
      const claims = kept(token, key)
      if (claims !== undefined) {
        onVerdict(Exit.succeed(claims))
        return noCheck
      }
      const reason = refused.get(key)
      if (reason !== undefined) {
        onVerdict(Exit.fail(new AuthFailed({ reason })))
        return noCheck
      }
      // One check per token at a time: every request that presents it meanwhile waits on that
      // check. Each asked auth before, so the 500 requests in flight when a busy client's verdict
      // ran out made up to 500 checks of one token (the hub-http bench's 50×10, every 30 s).
      const joined = checking.get(key)
      if (joined !== undefined) {
        joined.waiting.add(onVerdict)
        return () => leave(key, joined, onVerdict)
      }
      const check: Check = { waiting: new Set([onVerdict]), cancel: noCheck }
      checking.set(key, check)
      const tell = (verdict: Verdict) => {
        if (checking.get(key) === check) checking.delete(key)
        const waiting = [...check.waiting]
        check.waiting.clear()
        for (const w of waiting) {
          // One waiter's bug must not leave the others unanswered.
          try {
            w(verdict)
          } catch (cause) {
            console.error("auth client: a token check's waiter threw", cause)
          }
        }
      }
      check.cancel = authPeers.unsafeCallOn(bus, Subjects.authVerify, new Auth.Verify({ token }), { timeout: "3 seconds" }, (exit) => {
        if (Exit.isSuccess(exit)) {
          good.set(key, exit.value)
          return tell(expired(exit.value) ? Exit.fail(new AuthFailed({ reason: "token expired" })) : Exit.succeed(exit.value))
        }
        const failure = Cause.failureOption(exit.cause)
        if (Option.isNone(failure)) return tell(exit as Exit.Exit<never, never>)
        const e = failure.value
        if (e._tag !== "TokenRefused") return tell(Exit.fail(unavailable(e)))
        refused.set(key, e.reason)
        tell(Exit.fail(new AuthFailed({ reason: e.reason })))
      })
      return () => leave(key, check, onVerdict)
    }
    const verify = (token: string) =>
      Effect.async<Auth.Claims, AuthFailed | AuthUnavailable>((resume) => {
        const cancel = unsafeVerify(token, resume)
        return Effect.sync(cancel)
      })
    return { verify, unsafeVerify, known }
  })
)
