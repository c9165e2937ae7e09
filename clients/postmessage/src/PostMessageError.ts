/**
 * The one error type of this library. It is an `Error`, so the SDK's `Client.connect` rejects with
 * it and `onerror` carries it; `reason` says which rule of the spec was at stake.
 */
import * as Data from "effect/Data"

export type PostMessageErrorReason =
  /** No handshake (or handshake reply, or accept) arrived in time. */
  | "HandshakeTimeout"
  /** The setup handshake succeeded but `MCP_SETUP_COMPLETE` did not arrive in time. */
  | "SetupTimeout"
  /** The peer speaks another version of the transport protocol. */
  | "UnsupportedVersion"
  /** A handshake arrived on a transport that is already pinned to a peer; it was refused. */
  | "SecondHandshake"
  /** A handshake came from an origin not in the allow-list; it was refused. */
  | "OriginNotAllowed"
  /** The inner frame needs its setup phase (again) before it can serve this session. */
  | "SetupRequired"
  /** There is no window to talk to (popup blocked or closed, iframe removed). */
  | "NoPeerWindow"
  /** The transport was used after `close()`, or in the wrong phase. */
  | "Closed"

export class PostMessageError extends Data.TaggedError("PostMessageError")<{
  readonly reason: PostMessageErrorReason
  readonly message: string
}> {}

/** What was thrown, as an Error: what `onerror` and a rejected `start()` carry. */
export const asError = (thrown: unknown): Error => thrown instanceof Error ? thrown : new Error(String(thrown))
