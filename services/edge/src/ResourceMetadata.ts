/**
 * The hub's OAuth protected resource metadata (RFC 9728): where a client that got a 401 learns
 * which authorization server issues its tokens. A 401 of either era names this document.
 */
import * as Option from "effect/Option"
import type * as Http from "node:http"
import { refuse } from "./HttpChecks.ts"
import type { OriginPolicy } from "./OriginPolicy.ts"

export const METADATA_PATH = "/.well-known/oauth-protected-resource"

export interface ResourceMetadata {
  readonly path: typeof METADATA_PATH
  /** The document's URL as this request's client reaches it, for `WWW-Authenticate`. */
  readonly url: (req: Http.IncomingMessage) => string
  /** Answers a request at `path`: the document to a GET, 405 to anything else. */
  readonly handle: (req: Http.IncomingMessage, res: Http.ServerResponse) => void
}

export interface ResourceMetadataOptions {
  /** From EDGE_PUBLIC_URL, or a Host checked to be one: a client's Host goes into a header and a document. */
  readonly policy: OriginPolicy
  /** The protected resource's path (`/hub`). */
  readonly resource: string
  /** The authorization server (SWITCHBOARD_JWT_ISSUER), when tokens have one. */
  readonly issuer: Option.Option<string>
}

export const make = (options: ResourceMetadataOptions): ResourceMetadata => {
  const baseUrl = (req: Http.IncomingMessage) => options.policy.baseUrl(req.headers.host)
  const document = (req: Http.IncomingMessage) => ({
    resource: `${baseUrl(req)}${options.resource}`,
    ...(Option.isSome(options.issuer) ? { authorization_servers: [options.issuer.value] } : {}),
    bearer_methods_supported: ["header"]
  })
  return {
    path: METADATA_PATH,
    url: (req) => `${baseUrl(req)}${METADATA_PATH}`,
    handle: (req, res) => {
      if (req.method !== "GET") return refuse(res, { status: 405, headers: { allow: "GET" } })
      const body = JSON.stringify(document(req))
      res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) }).end(body)
    }
  }
}
