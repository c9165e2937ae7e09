/**
 * The auth service on the bus: answers `auth.verify` requests (body: the raw token) in the `auth`
 * queue group, so replicas share the load and edges never hold keys.
 */
import { Bus, Subjects } from "@switchboard/bus"
import { Auth } from "@switchboard/protocol"
import { Instruments, Metrics } from "@switchboard/telemetry"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schema from "effect/Schema"
import { Tokens } from "./Tokens.ts"

const encodeReply = Schema.encodeSync(Schema.parseJson(Auth.VerifyReply))

export const layer: Layer.Layer<never, Bus.BusError, Bus.Bus | Tokens> = Layer.scopedDiscard(
  Effect.gen(function*() {
    const bus = yield* Bus.Bus
    const tokens = yield* Tokens
    const checked = Instruments.tokenChecks(yield* Metrics.Metrics)
    const answer = (message: Bus.BusMessage) => {
      const started = performance.now()
      const took = () => (performance.now() - started) / 1000
      return tokens.verify(Bus.text(message)).pipe(
        Effect.match({
          onFailure: (e): Auth.VerifyReply => {
            checked(e.expired === true ? "expired" : "invalid", took())
            return { ok: false, error: e.reason }
          },
          onSuccess: (claims): Auth.VerifyReply => {
            checked("valid", took())
            return { ok: true, claims }
          }
        }),
        Effect.flatMap((reply) => bus.respond(message, encodeReply(reply))),
        Effect.withSpan("auth.verify"),
        Effect.catchAll((e) => Effect.logWarning("auth: could not answer a verify request", e))
      )
    }
    yield* bus.subscribe(Subjects.authVerify, (m) => void Effect.runFork(answer(m)), { queue: Subjects.Queue.auth })
    yield* Effect.logInfo("auth: answering token verification")
  })
)
