/**
 * The process logger: level from `LOG_LEVEL`, format from `LOG_FORMAT` (pretty on a terminal,
 * logfmt otherwise, or json). Mains run with `runMain({ disablePrettyLogger: true })` so that this
 * is the only logger.
 */
import * as Config from "effect/Config"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"

export const level = Config.logLevel("LOG_LEVEL").pipe(
  Config.withDescription("trace, debug, info, warning, error or none"),
  Config.withDefault(LogLevel.Info)
)

export const format = Config.literal("pretty", "logfmt", "json")("LOG_FORMAT").pipe(
  Config.withDescription("pretty, logfmt or json; pretty on a terminal and logfmt otherwise by default"),
  Config.withDefault(process.stdout.isTTY ? "pretty" : "logfmt")
)

/** Layers that replace the default logger with a printing one (`Logger.logfmtLogger` only formats). */
const loggers = { pretty: Logger.pretty, logfmt: Logger.logFmt, json: Logger.json } as const

export const layer: Layer.Layer<never> = Layer.unwrapEffect(
  Effect.gen(function*() {
    const l = yield* level
    const f = yield* format
    return Layer.merge(Logger.minimumLogLevel(l), loggers[f])
  }).pipe(Effect.orDie)
)
