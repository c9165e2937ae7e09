/**
 * The discovery documents of the CDP endpoint, which CDP clients fetch before they connect when
 * they are given an `http(s)://` URL: `/cdp/{extension_id}/json/version` names the WebSocket to
 * open (`webSocketDebuggerUrl`), `/json/list` the targets. The edge forwards them over the bus
 * (`http.router`). As on the WebSocket, the token comes by `Authorization: Bearer` or `?token=`,
 * and the extension must be the token's user's and connected.
 */
import { Peer, Subjects } from "@switchboard/bus"
import { Edge } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { PREFIX } from "./CdpSession.ts"
import type { Replica } from "./Replica.ts"

const httpPeers = Peer.protocol(Edge.ServiceHttp)
const DOCUMENT = /^\/cdp\/([^/]+)\/json(?:\/(version|list))?\/?$/

const problem = (status: number, error: string): Edge.HttpResponse => ({ status, body: { error } })

/** The answer to one request under `/cdp/`. */
const answer = (replica: Replica, request: Edge.HttpForward) =>
  Effect.gen(function*() {
    const found = DOCUMENT.exec(request.path)
    if (found === null) return problem(404, `no such document: ${request.path}; the CDP endpoint is the WebSocket ${PREFIX}{extension_id}`)
    if (request.method !== "GET") return problem(405, "the discovery documents answer GET")
    const raw = found[1] ?? ""
    let extensionId: string
    try {
      extensionId = decodeURIComponent(raw)
    } catch {
      return problem(400, `malformed percent-encoding in ${JSON.stringify(raw)}`)
    }
    const header = request.authorization?.match(/^Bearer\s+(\S+)$/i)?.[1]
    const token = header ?? request.query["token"]
    if (token === undefined) return problem(401, "a bearer token is required (Authorization header or ?token=)")
    const claims = yield* Effect.either(replica.auth.verify(token))
    if (claims._tag === "Left") return problem(401, `invalid token: ${claims.left.reason}`)
    const record = yield* replica.extensions.get(Subjects.Key.userExtension(claims.right.sub, extensionId)).pipe(Effect.orElseSucceed(() => Option.none()))
    if (Option.isNone(record)) return problem(404, `extension ${extensionId} not found or not connected`)
    const base = (request.base ?? "http://localhost").replace(/^http/, "ws")
    const socket = `${base}${PREFIX}${encodeURIComponent(extensionId)}`
    if (found[2] === "version") {
      return {
        status: 200,
        body: {
          "Browser": "Chrome/Switchboard",
          "Protocol-Version": "1.3",
          "User-Agent": `Switchboard CDP endpoint (extension ${record.value.value.name})`,
          "V8-Version": "",
          "WebKit-Version": "",
          "webSocketDebuggerUrl": socket
        }
      }
    }
    // A new client drives no tab yet: it opens its own (`Target.createTarget`).
    return { status: 200, body: [] }
  }).pipe(
    Effect.annotateLogs({ method: request.method, path: request.path }),
    Effect.catchAllCause((cause) => Effect.as(Effect.logError("router: a CDP discovery document failed", cause), problem(500, "internal error")))
  )

/** Serves the documents for as long as the router runs. */
export const serve = (replica: Replica) =>
  httpPeers.serve(
    Subjects.http("router"),
    (message, reply) => Effect.flatMap(answer(replica, message), reply(message).succeed),
    { queue: Subjects.Queue.service("router") }
  )
