/**
 * An echo service on the actor host: every frame goes back to its socket. Benchmarks use it to
 * measure the edge and bus alone; tests use it to watch what the edge forwards. A frame the edge
 * marked as over the rate limit gets the JSON-RPC error a real service would send.
 */
import { Actors } from "@switchboard/bus"
import { JsonRpc } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"

const limited = JsonRpc.encode(JsonRpc.errorResponse(null, JsonRpc.ErrorCode.ServerError, "Rate limit exceeded"))

export const layer = Layer.scopedDiscard(
  Actors.host({
    service: "echo",
    make: (conn) =>
      Effect.succeed({
        onFrame: (frame) => Effect.sync(() => conn.send(frame.limited ? limited : frame.data, frame.traceparent))
      })
  })
)

export const routes = { "/echo": { service: "echo", auth: "optional", traceInbound: true } } as const
