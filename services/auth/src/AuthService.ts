/**
 * The auth service on the bus: answers `Auth.Verify` asks on `auth.verify` in the `auth` queue
 * group, so replicas share the load and edges never hold keys.
 */
import { type Bus, Peer, Subjects } from "@switchboard/bus"
import { Auth } from "@switchboard/protocol"
import { Instruments, Metrics } from "@switchboard/telemetry"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { Tokens } from "./Tokens.ts"

const authPeers = Peer.protocol(Auth.AuthPeer)

export const layer: Layer.Layer<never, Bus.BusError, Bus.Bus | Tokens> = Layer.scopedDiscard(
  Effect.gen(function*() {
    const tokens = yield* Tokens
    const checked = Instruments.tokenChecks(yield* Metrics.Metrics)
    const answer = (request: Auth.Verify, reply: Peer.Reply<Auth.Verify>) => {
      const started = performance.now()
      const took = () => (performance.now() - started) / 1000
      return tokens.verify(request.token).pipe(
        Effect.tapBoth({
          onFailure: (e) => Effect.sync(() => checked(e.expired === true ? "expired" : "invalid", took())),
          onSuccess: () => Effect.sync(() => checked("valid", took()))
        }),
        Effect.mapError((e) => new Auth.TokenRefused({ reason: e.reason })),
        Effect.exit,
        Effect.flatMap(reply.complete),
        Effect.withSpan("auth.verify")
      )
    }
    yield* authPeers.serve(Subjects.authVerify, (message, reply) => answer(message, reply(message)), { queue: Subjects.Queue.auth })
    yield* Effect.logInfo("auth: answering token verification")
  })
)
