/** LOG_LEVEL takes the names the README documents as well as Effect's own, and says what it wants otherwise. */
import { describe, expect, it } from "@effect/vitest"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as LogLevel from "effect/LogLevel"
import { Settings } from "@switchboard/protocol"
import { Logging } from "../src/index.ts"

const levelOf = (value: string) =>
  Effect.withConfigProvider(Effect.either(Logging.level), ConfigProvider.fromMap(new Map([["LOG_LEVEL", value]])))

describe("LOG_LEVEL", () => {
  it.effect("accepts trace, debug, info, warning, error and none, in any case, and Effect's warn and off", () =>
    Effect.gen(function*() {
      const levels = { trace: LogLevel.Trace, debug: LogLevel.Debug, info: LogLevel.Info, warning: LogLevel.Warning, WARN: LogLevel.Warning, error: LogLevel.Error, none: LogLevel.None, off: LogLevel.None }
      for (const [name, level] of Object.entries(levels)) expect(yield* levelOf(name), name).toStrictEqual(Either.right(level))
    }))

  it.effect("refuses anything else, naming the values it takes", () =>
    Effect.gen(function*() {
      const refused = yield* levelOf("loud")
      expect(refused._tag).toBe("Left")
      // One name: the refusal's path is empty, since Config.string("LOG_LEVEL") puts the name in front itself.
      expect(refused._tag === "Left" ? Settings.describe(refused.left) : "").toBe("LOG_LEVEL must be trace, debug, info, warning, error or none, got loud")
    }))
})
