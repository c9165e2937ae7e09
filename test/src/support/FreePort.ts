/**
 * A TCP port nothing listens on right now, for a test that must start a server twice on the same
 * port (a client reconnecting to "the same" Switchboard after a restart).
 */
import * as Effect from "effect/Effect"
import { createServer } from "node:net"

export const freePort = Effect.async<number, Error>((resume) => {
  const server = createServer()
  server.once("error", (e) => resume(Effect.fail(e)))
  server.listen(0, "127.0.0.1", () => {
    const address = server.address()
    const port = typeof address === "object" && address !== null ? address.port : 0
    server.close(() => resume(port === 0 ? Effect.fail(new Error(`unexpected listen address ${String(address)}`)) : Effect.succeed(port)))
  })
}).pipe(Effect.orDie)
