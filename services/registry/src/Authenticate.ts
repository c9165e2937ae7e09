/**
 * In-band authentication of a registry socket that had no token at its upgrade, on `/hub` (MCP
 * over WebSocket) and `/tabs` (tab bridges) alike: an `authenticate` message first, whose token
 * gives the session its user. One place, so both endpoints take and refuse the same messages with
 * the same reasons; a token in a URL ends up in proxies' logs, a first message does not.
 */
import type { AuthClient } from "@switchboard/auth"
import { Edge, JsonRpc, Registry } from "@switchboard/protocol"
import { result } from "@switchboard/protocol/JsonRpc"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Schema from "effect/Schema"

const CloseCode = Edge.CloseCode
const decodeParams = Schema.decodeUnknownEither(Registry.AuthenticateParams)

/** Why a socket that says anything else before `authenticate` is closed. */
export const Required = "Authentication required: send authenticate first, or connect with ?token="
/** Why a socket that does not authenticate within `REGISTRY_AUTH_TIMEOUT` is closed. */
export const NotInTime = "Authentication failed: no authenticate message in time"

/** What a session lends to its authentication. */
export interface Authenticating {
  /** The socket's user: from the upgrade's token or an earlier `authenticate`; none before. */
  readonly user: () => string | undefined
  /** The first token verified: the session takes `user` as its own. */
  readonly authenticated: (user: string) => Effect.Effect<void>
  readonly close: (code: number, reason: string) => void
}

/**
 * One `authenticate`: its token must verify and, on a socket that has a user already, name the
 * same one (a session cannot change hands); otherwise the socket is closed with 1008 and why. As
 * a request it is answered `{}` through `answer`.
 */
export const authenticate = (
  auth: AuthClient.AuthClientShape,
  session: Authenticating,
  params: unknown,
  id: JsonRpc.Id | undefined,
  answer: (text: string) => void
): Effect.Effect<void> =>
  Effect.gen(function*() {
    const decoded = decodeParams(JsonRpc.isRecord(params) ? params : {})
    const token = Either.isRight(decoded) ? Registry.tokenOf(decoded.right) : undefined
    if (token === undefined) return session.close(CloseCode.PolicyViolation, "Authentication failed: authenticate needs params.token")
    const claims = yield* Effect.either(auth.verify(token))
    if (Either.isLeft(claims)) return session.close(CloseCode.PolicyViolation, `Authentication failed: ${claims.left.reason}`)
    const current = session.user()
    if (current !== undefined && claims.right.sub !== current) {
      return session.close(CloseCode.PolicyViolation, "Authentication failed: a session cannot change its user")
    }
    if (current === undefined) yield* session.authenticated(claims.right.sub)
    if (id !== undefined) answer(result(id, {}))
  })

/**
 * A frame of a socket whose user is not known yet: `authenticate` is taken, and anything else
 * (a request, a notification, an answer to some call) closes the socket unanswered, so nothing a
 * stranger sends is acted on.
 */
export const beforeUser = (
  auth: AuthClient.AuthClientShape,
  session: Authenticating,
  incoming: JsonRpc.Incoming,
  answer: (text: string) => void
): Effect.Effect<void> | void => {
  if (incoming._tag === "Response" || incoming.message.method !== Registry.Authenticate) {
    return session.close(CloseCode.PolicyViolation, Required)
  }
  return authenticate(auth, session, incoming.message.params, incoming._tag === "Request" ? incoming.message.id : undefined, answer)
}
