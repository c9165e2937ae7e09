/**
 * How other services (the registry) ask a user's connected browser extension to run one proxy
 * method, as the proxy itself: a request to `router.internal`, answered by whichever router replica
 * takes it, on behalf of the user's most recently connected extension (or the next, if that one's
 * session is gone).
 */
import { Bus, Subjects } from "@switchboard/bus"
import { Json, JsonRpc, Proxy } from "@switchboard/protocol"
import * as Data from "effect/Data"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"

/** The request got no result: the extension's JSON-RPC error, or why nobody could answer (-32000). */
export class InternalError extends Data.TaggedError("InternalError")<{
  readonly code: number
  readonly message: string
  readonly cause?: unknown
}> {}

export interface RequestOptions {
  /**
   * How long to wait for the router. The router answers by itself within `ROUTER_INTERNAL_TIMEOUT`
   * (default 10 s), so this only matters when no router replica survives the request.
   */
  readonly timeout?: Duration.DurationInput
}

const requestCodec = Json.codec(Proxy.InternalRequest)
const replyCodec = Json.codec(Proxy.InternalReply)

/** Runs `method` with `params` on the user's most recently connected extension; its `result` on success. */
export const request = Effect.fn("InternalClient.request")(function*(
  user: string,
  method: string,
  params?: Readonly<Record<string, unknown>>,
  options?: RequestOptions
) {
  const bus = yield* Bus.Bus
  const body = requestCodec.encode(params === undefined ? { user, method } : { user, method, params })
  const answer = yield* bus.request(Subjects.routerInternal, body, { timeout: options?.timeout ?? "30 seconds" }).pipe(
    Effect.mapError((e) => {
      switch (e._tag) {
        case "NoResponders":
          return new InternalError({ code: JsonRpc.ErrorCode.ServerError, message: "The router is unavailable: no router replica is running", cause: e })
        case "RequestTimeout":
          return new InternalError({ code: JsonRpc.ErrorCode.ServerError, message: `The router did not answer within ${Duration.format(e.timeout)}`, cause: e })
        case "BusError":
          return new InternalError({ code: JsonRpc.ErrorCode.ServerError, message: `The router is unreachable: ${e.message}`, cause: e })
      }
    })
  )
  const reply = replyCodec.decode(Bus.text(answer))
  if (Either.isLeft(reply)) {
    return yield* new InternalError({ code: JsonRpc.ErrorCode.InternalError, message: "Internal error: malformed reply from the router", cause: reply.left })
  }
  if (!reply.right.ok) return yield* new InternalError({ code: reply.right.code, message: reply.right.message })
  return reply.right.result
})
