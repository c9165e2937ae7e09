/**
 * What the router's actors do with a message that is not theirs to write (pass it on, or refuse
 * an internal request), and the few ways an actor carries on past a failure it can only log. The
 * JSON-RPC texts they send are built by `@switchboard/protocol/JsonRpc` and `/Proxy`.
 */
import { type JsonRpc, Proxy } from "@switchboard/protocol"
import * as Effect from "effect/Effect"

/**
 * A message just parsed from a frame, readied to be passed on (under another id, if given):
 * `jsonrpc` filled in, and the spec's optional `connectionId` routing field dropped, so it never
 * reaches the extension. Changed in place, since the parse made it for this one use.
 */
export const relayed = (message: object, id?: JsonRpc.Id): object => {
  const fields = message as Record<string, unknown>
  if (id !== undefined) fields["id"] = id
  if (fields["jsonrpc"] === undefined) fields["jsonrpc"] = "2.0"
  if ("connectionId" in fields) delete fields["connectionId"]
  return fields
}

/** Why an internal request got no result, as its asker receives it. */
export const refused = (code: number, message: string) => new Proxy.InternalFailure({ code, message })

/** Work the actor carries on without when it fails (a KV write, a reply); the failure is logged. */
export const warnIfFails = (what: string) => <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A | void, never, R> =>
  Effect.catchAll(self, (e) => Effect.logWarning(`router: ${what}`, e))
/** A read the actor survives without, taking `fallback` instead; the failure is logged. */
export const orWarn = <B>(what: string, fallback: B) => <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A | B, never, R> =>
  Effect.catchAll(self, (e) => Effect.as(Effect.logWarning(`router: ${what}`, e), fallback))
