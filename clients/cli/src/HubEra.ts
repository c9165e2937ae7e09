/**
 * Which MCP era the user's hub speaks, asked the way a dual-era client asks: a `server/discover`
 * POST to `/hub` (2026-07-28). A hub that lists 2026-07-28 among its versions is modern; one that
 * answers as a legacy server would (an HTTP or JSON-RPC error about the request, a missing
 * session) is legacy, and the bridge keeps today's WebSocket session with it.
 */
import { CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY } from "@modelcontextprotocol/client"
import * as z from "zod"
import { Refused } from "./Refused.ts"

/** The modern revision the bridge speaks to the hub. */
export const MODERN = "2026-07-28"

export type HubEra =
  | { readonly _tag: "Modern" }
  | { readonly _tag: "Legacy"; readonly why: string }

const Discovered = z.looseObject({
  result: z.looseObject({ supportedVersions: z.array(z.string()) }).optional(),
  error: z.looseObject({ code: z.number(), message: z.string() }).optional()
})

/** Statuses of a hub that is there but cannot answer now; asking again later may tell. */
const transient = (status: number) => status === 408 || status === 429 || status >= 500

export class HubUnavailable extends Error {}

/**
 * Asks `url` (the hub's HTTP URL) which era it speaks. Throws `Refused` when the token or origin is
 * refused (the WebSocket would be refused the same way), `HubUnavailable` for a hub that answers
 * 5xx, and the network's own error when nothing answers.
 */
export const probe = async (url: URL, token: string, version: string, signal: AbortSignal, name: string): Promise<HubEra> => {
  const response = await fetch(url, {
    method: "POST",
    signal: AbortSignal.any([signal, AbortSignal.timeout(10_000)]),
    headers: {
      accept: "application/json, text/event-stream",
      "content-type": "application/json",
      authorization: `Bearer ${token}`,
      "mcp-protocol-version": MODERN,
      "mcp-method": "server/discover"
    },
    body: JSON.stringify({
      jsonrpc: "2.0",
      id: 0,
      method: "server/discover",
      params: {
        _meta: {
          [PROTOCOL_VERSION_META_KEY]: MODERN,
          [CLIENT_INFO_META_KEY]: { name: "switchboard-mcp", version },
          [CLIENT_CAPABILITIES_META_KEY]: {}
        }
      }
    })
  })
  const text = await response.text()
  if (response.status === 401 || response.status === 403) throw new Refused({ url: name, endpoint: url.pathname, status: response.status })
  if (transient(response.status)) throw new HubUnavailable(`HTTP ${response.status} from ${url.origin}${url.pathname}`)
  // 404 and 405 included: a hub that serves /hub over WebSocket only; its upgrade decides the rest.
  if (response.status !== 200) return { _tag: "Legacy", why: `server/discover answered HTTP ${response.status}` }
  if (!(response.headers.get("content-type") ?? "").startsWith("application/json")) {
    return { _tag: "Legacy", why: `server/discover answered ${response.headers.get("content-type") ?? "no content type"}, not JSON` }
  }
  let body: z.infer<typeof Discovered>
  try {
    body = Discovered.parse(JSON.parse(text))
  } catch {
    return { _tag: "Legacy", why: "server/discover answered something other than a JSON-RPC response" }
  }
  if (body.result?.supportedVersions.includes(MODERN) === true) return { _tag: "Modern" }
  if (body.error !== undefined) return { _tag: "Legacy", why: `server/discover answered ${body.error.code} ${body.error.message}` }
  return { _tag: "Legacy", why: `the hub offers ${JSON.stringify(body.result?.supportedVersions ?? [])}, not ${MODERN}` }
}
