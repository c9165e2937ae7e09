/**
 * The process logger: level from `LOG_LEVEL`, format from `LOG_FORMAT` (pretty on a terminal,
 * logfmt otherwise, or json). Mains run with `runMain({ disablePrettyLogger: true })` so that this
 * is the only logger.
 */
import * as Config from "effect/Config"
import * as ConfigError from "effect/ConfigError"
import * as Either from "effect/Either"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"

/** The names the README documents, and Effect's own labels (`warn`, `off`, ...), in any case. */
const LEVELS: Readonly<Record<string, LogLevel.LogLevel>> = {
  all: LogLevel.All,
  trace: LogLevel.Trace,
  debug: LogLevel.Debug,
  info: LogLevel.Info,
  warn: LogLevel.Warning,
  warning: LogLevel.Warning,
  error: LogLevel.Error,
  fatal: LogLevel.Fatal,
  none: LogLevel.None,
  off: LogLevel.None
}

export const level = Config.string("LOG_LEVEL").pipe(
  Config.mapOrFail((value) => {
    const found = LEVELS[value.trim().toLowerCase()]
    return found === undefined
      // An empty path: Config.string("LOG_LEVEL") puts its name in front of this one, and a path of
      // ["LOG_LEVEL"] made the line read LOG_LEVEL_LOG_LEVEL. The message names it, as Settings' do.
      ? Either.left(ConfigError.InvalidData([], `LOG_LEVEL must be trace, debug, info, warning, error or none, got ${value.trim() === value && value !== "" ? value : JSON.stringify(value)}`))
      : Either.right(found)
  }),
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
