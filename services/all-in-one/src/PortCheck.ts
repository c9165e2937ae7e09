/**
 * Whether `PORT` is free, asked before anything starts. The edge binds last, once the services
 * behind it run, so a port in use used to be reported after every service had logged that it
 * started. The edge's own bind still reports a port taken in the moment between.
 */
import { EdgeConfig } from "@switchboard/edge"
import { Settings } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Net from "node:net"

export const portFree = Effect.gen(function*() {
  const port = yield* EdgeConfig.port
  const host = yield* EdgeConfig.host
  // 0 asks for any free port: there is nothing to be taken.
  if (port === 0) return
  yield* Effect.async<void, Settings.StartupFailure>((resume) => {
    const probe = Net.createServer()
    probe.once("error", (e) => resume(Effect.fail(Settings.listenFailure(e, host, port))))
    probe.listen({ port, host, exclusive: true }, () => probe.close(() => resume(Effect.void)))
  })
})
