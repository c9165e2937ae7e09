/**
 * A TCP relay on 127.0.0.1 between one process's NATS connection and the server, which a test cuts
 * and restores (the connection drops, and comes back once restored, as after a NATS node died) or
 * pauses and resumes (bytes are held, as on a slow network: nothing drops). Lets a test lose the
 * peer messages sent to one router replica for certain.
 */
import * as Effect from "effect/Effect"
import * as net from "node:net"

export interface Relay {
  /** `nats://127.0.0.1:<port>`, for the process that goes through the relay. */
  readonly url: string
  /** Drops every connection, and refuses new ones until `restore`. */
  readonly cut: Effect.Effect<void>
  readonly restore: Effect.Effect<void>
  /** Holds the bytes of every connection, both ways, until `resume`. */
  readonly pause: Effect.Effect<void>
  readonly resume: Effect.Effect<void>
}

/** A relay to `upstream` (`nats://host:port`) until the scope closes. */
export const make = (upstream: string) =>
  Effect.acquireRelease(
    Effect.async<{ readonly relay: Relay; readonly close: () => void }>((resume) => {
      const target = new URL(upstream)
      const pairs = new Set<readonly [net.Socket, net.Socket]>()
      let refusing = false
      let paused = false
      const server = net.createServer((inbound) => {
        if (refusing) return void inbound.destroy()
        const outbound = net.connect(Number(target.port), target.hostname)
        const pair = [inbound, outbound] as const
        pairs.add(pair)
        const drop = () => {
          pairs.delete(pair)
          inbound.destroy()
          outbound.destroy()
        }
        inbound.on("error", drop).on("close", drop)
        outbound.on("error", drop).on("close", drop)
        inbound.pipe(outbound)
        outbound.pipe(inbound)
        if (paused) {
          inbound.pause()
          outbound.pause()
        }
      })
      server.listen(0, "127.0.0.1", () => {
        const address = server.address()
        const port = typeof address === "object" && address !== null ? address.port : 0
        const each = (f: (s: net.Socket) => void) => {
          for (const [a, b] of pairs) {
            f(a)
            f(b)
          }
        }
        resume(Effect.succeed({
          relay: {
            url: `nats://127.0.0.1:${port}`,
            cut: Effect.sync(() => {
              refusing = true
              each((s) => s.destroy())
              pairs.clear()
            }),
            restore: Effect.sync(() => void (refusing = false)),
            pause: Effect.sync(() => {
              paused = true
              each((s) => s.pause())
            }),
            resume: Effect.sync(() => {
              paused = false
              each((s) => s.resume())
            })
          },
          close: () => {
            each((s) => s.destroy())
            server.close()
          }
        }))
      })
    }),
    ({ close }) => Effect.sync(close)
  ).pipe(Effect.map(({ relay }) => relay))
