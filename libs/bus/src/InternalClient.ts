/**
 * How other services (the registry) ask a user's connected browser extension to run one proxy
 * method, as the proxy itself: a request to `router.internal`, answered by whichever router replica
 * takes it, on behalf of the user's most recently connected extension (or the next, if that one's
 * session is gone). It lives with the bus, not in the router: its callers (the registry) need the
 * router's peer protocol and subject, not the router.
 */
import { JsonRpc, Proxy } from "@switchboard/protocol"
import * as Data from "effect/Data"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Peer from "./Peer.ts"
import * as Subjects from "./Subjects.ts"

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

/** The router's peer protocol; `router.internal` serves its `InternalRequest`. */
const peers = Peer.protocol(Proxy.RouterPeer)

/** Runs `method` with `params` on the user's most recently connected extension; its `result` on success. */
export const request = Effect.fn("InternalClient.request")(function*(
  user: string,
  method: string,
  params?: Readonly<Record<string, unknown>>,
  options?: RequestOptions
) {
  const asked = new Proxy.InternalRequest(params === undefined ? { user, method } : { user, method, params })
  return yield* peers.call(Subjects.routerInternal, asked, { timeout: options?.timeout ?? "30 seconds" }).pipe(
    Effect.catchTags({
      InternalFailure: (e) => new InternalError({ code: e.code, message: e.message }),
      PeerTimeout: (e) =>
        new InternalError({ code: JsonRpc.ErrorCode.ServerError, message: `The router did not answer within ${Duration.format(e.timeout)}`, cause: e }),
      PeerUnavailable: (e) => {
        switch (e.reason) {
          case "NoResponders":
            return new InternalError({ code: JsonRpc.ErrorCode.ServerError, message: "The router is unavailable: no router replica is running", cause: e })
          case "Bus":
            return new InternalError({ code: JsonRpc.ErrorCode.ServerError, message: `The router is unreachable: ${e.cause instanceof Error ? e.cause.message : String(e.cause)}`, cause: e })
          case "Malformed":
            return new InternalError({ code: JsonRpc.ErrorCode.InternalError, message: "Internal error: malformed reply from the router", cause: e })
        }
      }
    })
  )
})
