/** The process logger: level from `LOG_LEVEL`, logfmt lines on stderr-friendly stdout. */
import * as Config from "effect/Config"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"

export const level = Config.logLevel("LOG_LEVEL").pipe(
  Config.withDescription("trace, debug, info, warning, error or none"),
  Config.withDefault(LogLevel.Info)
)

export const layer: Layer.Layer<never> = Layer.unwrapEffect(
  Effect.map(Effect.orDie(level), (l) => Layer.merge(Logger.minimumLogLevel(l), Logger.replace(Logger.defaultLogger, Logger.logfmtLogger)))
)
