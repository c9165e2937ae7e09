/**
 * An actor's handler that throws is a bug in that handler: the host logs it with the error's own
 * message (a `RangeError` logged as a plain value used to print `message={}`), and the actor goes
 * on with its next frame, so one bad frame costs one answer, not the connection.
 */
import { describe, expect, it } from "@effect/vitest"
import { Actors } from "@switchboard/bus"
import { Edge } from "@switchboard/edge"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import { connect } from "./support/Client.ts"
import * as Echo from "./support/Echo.ts"
import { busLayer, stack } from "./support/Stack.ts"
import { until } from "./support/Until.ts"

/** Echoes every frame, but throws as a deep recursion would on the frame `boom`. */
const throwing = Layer.scopedDiscard(
  Actors.host({
    service: "echo",
    make: (conn) =>
      Effect.succeed({
        onFrame: (frame) => {
          if (frame.text === "boom") throw new RangeError("Maximum call stack size exceeded")
          conn.send(frame.data)
        }
      })
  })
)

describe("actor errors", () => {
  it.scopedLive("a handler that throws is logged with its error's message, and the actor handles the next frame", () =>
    Effect.gen(function*() {
      const lines: Array<string> = []
      const logs = Layer.provide(
        Logger.replace(Logger.defaultLogger, Logger.map(Logger.logfmtLogger, (line) => void lines.push(line))),
        Logger.minimumLogLevel(LogLevel.Error)
      )
      const ctx = yield* Layer.build(stack(busLayer(), { routes: Echo.routes, services: throwing.pipe(Layer.provide(logs)) }))
      const ws = Context.get(ctx, Edge.EdgeServer).url.replace("http", "ws")
      const c = yield* connect(`${ws}/echo`)
      c.send("boom")
      c.send("after")
      expect(yield* c.nextText).toBe("after")
      yield* until(() => lines.some((l) => l.includes("actor handler threw")), "the handler's error in the log")
      const line = lines.find((l) => l.includes("actor handler threw")) ?? ""
      expect(line).toContain("RangeError: Maximum call stack size exceeded")
      expect(line).not.toContain("message={}")
    }))
})
