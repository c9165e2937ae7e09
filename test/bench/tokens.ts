/**
 * The bench's tokens, apart from processes.ts so that a load process (topicsWorker.ts) can mint its
 * own without bundling the testcontainers that processes.ts starts NATS with.
 */
import { Tokens } from "@switchboard/auth"
import * as Option from "effect/Option"

/** Every target the bench starts verifies with this secret. */
export const SECRET = "bench-secret-that-is-long-enough-for-hs256"

/** A token every target accepts (they all share the bench's secret). */
export const issueToken = (options: Tokens.IssueOptions) =>
  Tokens.make({
    secret: Option.some(new TextEncoder().encode(SECRET)),
    jwksUrl: Option.none(),
    issuer: Option.none(),
    audience: Option.none()
  }).issue(options)
