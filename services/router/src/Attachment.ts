/**
 * An MCP client's attachment to an extension, apart from the client's actor (`ClientSession.ts`):
 * asking the extension's actor to take the client (`Attach`), the connection's record in KV that
 * lets a replica adopting either socket know it, finding that record again on adoption, and
 * letting the attachment go (`Detach`).
 */
import { type Actors, Subjects } from "@switchboard/bus"
import { Proxy } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import { randomUUID } from "node:crypto"
import { orWarn, warnIfFails } from "./Replies.ts"
import { peers, type Replica } from "./Replica.ts"

/** The client's connection to an extension. */
export interface Session {
  readonly connectionId: string
  readonly extensionId: string
  readonly extConn: Subjects.ConnId
  /** The extension's socket, for forwarding. */
  readonly extension: Actors.Socket
  peerCount: number
}

/** An attachment the extension's actor took: the session, the extension's name and the edge of its socket. */
export interface Attached {
  readonly session: Session
  readonly name: string
  readonly edge: string
}

/**
 * Asks the actor of `owner`'s extension `extensionId` to take the client; none when there is no
 * such extension, or its actor refused or is gone (both as good as not found to the client).
 */
export const attach = (replica: Replica, conn: Actors.Connection, owner: string, extensionId: string) =>
  Effect.gen(function*() {
    const record = yield* replica.extensions.get(Subjects.Key.userExtension(owner, extensionId)).pipe(
      orWarn(`could not read extension ${extensionId} of ${owner} to connect to it`, Option.none())
    )
    if (Option.isNone(record)) return Option.none<Attached>()
    const ext = record.value.value
    const connectionId = `conn-${randomUUID()}`
    const answer = yield* peers
      .ask(conn, Subjects.ConnId(ext.conn), new Proxy.Attach({ connectionId, user: owner, clientConn: conn.id }), { timeout: "5 seconds" })
      .pipe(Effect.either)
    // Nobody listens: a record a crash left behind, which is as good as not found. A refusal
    // is not found either. Anything else means a live extension's actor could not be
    // reached, which is worth knowing.
    if (Either.isLeft(answer)) {
      const why = answer.left
      if (why._tag !== "AttachRefused" && !(why._tag === "PeerUnavailable" && why.reason === "NoResponders")) {
        yield* Effect.logWarning(`router: extension ${extensionId} of ${owner} did not answer attach`, why)
      }
      return Option.none<Attached>()
    }
    const session: Session = {
      connectionId,
      extensionId,
      extConn: Subjects.ConnId(ext.conn),
      extension: replica.link.to(Subjects.EdgeId(ext.edge), Subjects.ConnId(ext.conn)),
      peerCount: answer.right.peerCount
    }
    return Option.some<Attached>({ session, name: answer.right.name, edge: ext.edge })
  })

/** Records the attachment in KV, so that a replica adopting either socket knows it. */
export const record = (replica: Replica, conn: Actors.Connection, owner: string, { edge, session }: Attached) =>
  replica.proxies
    .put(Subjects.Key.proxyConnection(session.connectionId), {
      connectionId: session.connectionId,
      user: owner,
      extensionId: session.extensionId,
      extensionConn: session.extConn,
      extensionEdge: edge,
      clientConn: conn.id
    })
    .pipe(warnIfFails(`could not record ${session.connectionId}; a replica that adopts either socket will not know it`))

/** The attachment an adopted client had, from its record; none when the record is gone. */
export const restore = (replica: Replica, connectionId: string) =>
  Effect.gen(function*() {
    const found = yield* replica.proxies.get(Subjects.Key.proxyConnection(connectionId)).pipe(
      orWarn(`could not read ${connectionId} of an adopted client; it carries on unconnected`, Option.none())
    )
    return Option.map(found, ({ value }) => sessionOf(replica, { ...value, connectionId }))
  })

/**
 * The session of a client whose attachment another replica made, from what it recorded or
 * handed over. Its peer count is this client alone until the extension's actor says otherwise.
 */
export const sessionOf = (
  replica: Replica,
  { connectionId, extensionConn, extensionEdge, extensionId }: {
    readonly connectionId: string
    readonly extensionId: string
    readonly extensionConn: string
    readonly extensionEdge: string
  }
): Session => ({
  connectionId,
  extensionId,
  extConn: Subjects.ConnId(extensionConn),
  extension: replica.link.to(Subjects.EdgeId(extensionEdge), Subjects.ConnId(extensionConn)),
  peerCount: 1
})

/** Tells the extension's actor the client let go, and removes the record. */
export const detach = (replica: Replica, conn: Actors.Connection, connectionId: string, extConn: Subjects.ConnId) =>
  Effect.suspend(() => {
    peers.tell(conn, extConn, new Proxy.Detach({ connectionId }))
    return replica.proxies.delete(Subjects.Key.proxyConnection(connectionId)).pipe(warnIfFails(`could not remove the record of ${connectionId}`))
  })
