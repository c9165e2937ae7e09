/**
 * Other services' requests to a user's extension (`router.internal`, sent by
 * `@switchboard/bus`'s `InternalClient`): whichever replica takes one asks the actor of the
 * user's most recently connected extension, which asks the extension itself (`ExtensionSession.ts`).
 */
import { Peer, Subjects } from "@switchboard/bus"
import { JsonRpc, type Proxy } from "@switchboard/protocol"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import { refused } from "./Replies.ts"
import { peers, type Replica } from "./Replica.ts"

const { ErrorCode } = JsonRpc

/** Answers `router.internal` in the replicas' queue group until the scope ends. */
export const serve = (replica: Replica) =>
  Effect.gen(function*() {
    const { config, extensions } = replica
    /** Internal requests go over the bus even to an actor of this replica: their reply subject survives a hand-off. */
    const outside = Peer.outside(replica.bus, "router")

    /** One extension's actor asked; none when its session is gone (a record a crash left behind). */
    const askExtension = (ext: Proxy.ExtensionRecord, request: Proxy.InternalRequest) =>
      peers.ask(outside, Subjects.ConnId(ext.conn), request, {
        // The actor times the extension out itself; this only catches an actor that is gone.
        timeout: Duration.sum(config.internalTimeout, Duration.seconds(1))
      }).pipe(
        Effect.map(Option.some),
        Effect.catchTags({
          PeerUnavailable: (e) =>
            e.reason === "NoResponders"
              ? Effect.succeed(Option.none())
              : Effect.fail(
                e.reason === "Malformed"
                  ? refused(ErrorCode.InternalError, "Internal error: malformed reply from the extension's session")
                  : refused(ErrorCode.ServerError, `The extension did not answer: ${e.message}`)
              ),
          PeerTimeout: (e) => Effect.fail(refused(ErrorCode.ServerError, `The extension did not answer: no reply within ${Duration.format(e.timeout)}`))
        })
      )

    /** The user's most recently connected extension answers, or the next one if its session is gone. */
    const internalRequest = (request: Proxy.InternalRequest) =>
      Effect.gen(function*() {
        const found = yield* Effect.either(extensions.values(Subjects.Key.userExtensions(request.user)))
        if (Either.isLeft(found)) {
          yield* Effect.logWarning(`router: could not look up the extensions of ${request.user} for an internal request`, found.left)
          return yield* refused(ErrorCode.InternalError, "Internal error: could not look up the user's extensions")
        }
        const newestFirst = found.right.map(({ value }) => value).sort((a, b) => b.connectedAt - a.connectedAt)
        for (const ext of newestFirst) {
          const answer = yield* askExtension(ext, request)
          if (Option.isSome(answer)) return answer.value
        }
        return yield* refused(ErrorCode.ServerError, "No browser extension is connected for this user")
      })

    yield* peers.serve(
      Subjects.routerInternal,
      (message, reply) => {
        if (message._tag !== "InternalRequest") return Effect.logWarning(`router: ignored a ${message._tag} on ${Subjects.routerInternal}`)
        return Effect.flatMap(Effect.exit(internalRequest(message)), reply(message).complete)
      },
      { queue: Subjects.Queue.service("router") }
    )
  })
