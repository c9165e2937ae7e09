/**
 * Settings as people type them, with the range each one needs: whole numbers, rates and durations
 * (`30s`, `5m`, `1h`, `250ms`, `2d` or Effect's `30 seconds`). A refusal names the variable, the
 * value and what is expected, so that a process can print `describe(error)` as its one line.
 */
import * as Config from "effect/Config"
import * as Data from "effect/Data"
import * as ConfigError from "effect/ConfigError"
import * as Duration from "effect/Duration"
import * as Either from "effect/Either"
import * as Option from "effect/Option"

type Parse<A> = (text: string) => Either.Either<A, ConfigError.ConfigError>

const shown = (text: string) => (text.trim() === text && text !== "" ? text : JSON.stringify(text))

const refuse = (name: string, expected: string, text: string) =>
  Either.left(ConfigError.InvalidData([], `${name} must be ${expected}, got ${shown(text)}`))

const setting = <A>(name: string, parse: (name: string) => Parse<A>, fallback: A, description: string): Config.Config<A> =>
  Config.string(name).pipe(
    Config.mapOrFail(parse(name)),
    Config.withDescription(description),
    Config.withDefault(fallback)
  )

const wholeNumber = (min: number, max: number, expected: string) => (name: string): Parse<number> => (text) => {
  const n = text.trim() === "" ? Number.NaN : Number(text)
  return Number.isSafeInteger(n) && n >= min && n <= max ? Either.right(n) : refuse(name, expected, text)
}

/** A count or size that must be at least 1. */
export const positiveInt = (name: string, fallback: number, description: string) =>
  setting(name, wholeNumber(1, Number.MAX_SAFE_INTEGER, "a whole number > 0"), fallback, description)

/** A count where 0 has a meaning of its own (usually "no limit"), spelled out in `zero`. */
export const nonNegativeInt = (name: string, fallback: number, description: string, zero?: string) =>
  setting(
    name,
    wholeNumber(0, Number.MAX_SAFE_INTEGER, zero === undefined ? "a whole number >= 0" : `a whole number >= 0 (0 is ${zero})`),
    fallback,
    description
  )

/** A whole number from `min` to `max`, e.g. a port. */
export const intBetween = (name: string, min: number, max: number, fallback: number, description: string) =>
  setting(name, wholeNumber(min, max, `a whole number from ${min} to ${max}`), fallback, description)

/** A rate or other quantity that may have a fraction but must be more than 0. */
export const positiveNumber = (name: string, fallback: number, description: string) =>
  setting(
    name,
    (name) => (text) => {
      const n = text.trim() === "" ? Number.NaN : Number(text)
      return Number.isFinite(n) && n > 0 ? Either.right(n) : refuse(name, "a number > 0", text)
    },
    fallback,
    description
  )

const UNITS = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const
const SHORT = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$/

/** `30s`, `5m`, `1h`, `250ms`, `2d`, or what Effect's Config.duration takes (`30 seconds`). */
export const parseDuration = (text: string): Option.Option<Duration.Duration> => {
  const trimmed = text.trim()
  if (trimmed.startsWith("-")) return Option.none()
  const short = SHORT.exec(trimmed)
  if (short !== null) return Option.some(Duration.millis(Number(short[1]) * UNITS[short[2] as keyof typeof UNITS]))
  return Option.filter(Duration.decodeUnknown(trimmed), Duration.isFinite)
}

const DURATION = "a duration such as 30s, 5m, 1h, 250ms, 2d or 30 seconds"

const durationOver = (allowZero: boolean) => (name: string): Parse<Duration.Duration> => (text) =>
  Option.match(parseDuration(text), {
    onNone: () => refuse(name, DURATION, text),
    onSome: (d) =>
      allowZero || Duration.greaterThan(d, Duration.zero) ? Either.right(d) : refuse(name, `${DURATION}, more than 0`, text)
  })

/** A timeout or interval: more than 0, since a zero one would fire at once or spin. */
export const duration = (name: string, fallback: Duration.DurationInput, description: string) =>
  setting(name, durationOver(false), Duration.decode(fallback), description)

/**
 * A liveness period: more than 0 and at most half of `lifetime`, the life of the key it renews, so
 * that one late renewal does not let the key lapse and have a live process taken for dead.
 */
export const livenessInterval = (name: string, fallback: Duration.DurationInput, lifetime: Duration.DurationInput, description: string) => {
  const max = Duration.divide(Duration.decode(lifetime), 2).pipe(Option.getOrThrow)
  return setting(
    name,
    (name) => (text) =>
      Either.flatMap(durationOver(false)(name)(text), (d) =>
        Duration.lessThanOrEqualTo(d, max)
          ? Either.right(d)
          : refuse(name, `at most ${Duration.format(max)} (half the ${Duration.format(Duration.decode(lifetime))} life of the key it renews)`, text)),
    Duration.decode(fallback),
    description
  )
}

/** A pause or grace period where 0 means "none". */
export const nonNegativeDuration = (name: string, fallback: Duration.DurationInput, description: string) =>
  setting(name, durationOver(true), Duration.decode(fallback), description)

/** A limit that is off unless set: a duration more than 0, or none. */
export const optionalDuration = (name: string, description: string): Config.Config<Option.Option<Duration.Duration>> =>
  Config.option(Config.string(name).pipe(Config.mapOrFail(durationOver(false)(name)), Config.withDescription(description)))

const FLAGS: ReadonlyMap<string, boolean> = new Map([["true", true], ["false", false], ["on", true], ["off", false], ["yes", true], ["no", false], ["1", true], ["0", false]])

/** On or off: `true`/`false` (also `on`/`off`, `yes`/`no`, `1`/`0`, in any case). */
export const flag = (name: string, fallback: boolean, description: string) =>
  setting(
    name,
    (name) => (text) => {
      const value = FLAGS.get(text.trim().toLowerCase())
      return value === undefined ? refuse(name, "true or false", text) : Either.right(value)
    },
    fallback,
    description
  )

/**
 * A number > 0 (a burst, say) refused when below `floor` (its rate): a bucket smaller than one
 * second's refill never fills.
 */
export const atLeast = (name: string, fallback: number, description: string, floor: Config.Config<number>, floorName: string) =>
  Config.all([positiveNumber(name, fallback, description), floor]).pipe(
    Config.mapOrFail(([value, min]) =>
      value >= min
        ? Either.right(value)
        : Either.left(ConfigError.InvalidData([], `${name} must be at least ${floorName} (${min}), got ${value}`))
    )
  )

/** One line for a person: each refusal's own message, naming its variable. */
export const describe = (error: ConfigError.ConfigError): string => {
  switch (error._op) {
    case "And":
      return `${describe(error.left)}; ${describe(error.right)}`
    case "Or":
      return `${describe(error.left)} (or: ${describe(error.right)})`
    default: {
      const name = error.path.join("_")
      const message = error.message.replace(/\s+/g, " ")
      return name === "" || message.includes(name) ? message : `${name}: ${message}`
    }
  }
}

/**
 * What stops a process from starting once its settings are read: a port in use, a host that does
 * not resolve, a bus it cannot reach. The message is the whole story, naming the setting to change.
 */
export class StartupFailure extends Data.TaggedError("StartupFailure")<{ readonly message: string; readonly cause?: unknown }> {}

/**
 * Why a server could not listen, in words that name the setting to change: `portSetting` for the
 * port (`PORT`, `METRICS_PORT`), `HOST` for the address, which every port of a process binds.
 */
export const listenFailure = (error: Error & { readonly code?: string }, host: string, port: number, portSetting = "PORT") => {
  const message = error.code === "EADDRINUSE"
    ? `cannot listen on ${host}:${port}: the port is in use (set ${portSetting} to a free port)`
    : error.code === "EACCES"
    ? `cannot listen on ${host}:${port}: permission denied (ports below 1024 need privileges; set ${portSetting})`
    : error.code === "ENOTFOUND" || error.code === "EAI_AGAIN"
    ? `HOST=${host} does not resolve (${error.code}); set HOST to an address or name of this machine, e.g. 0.0.0.0`
    : error.code === "EADDRNOTAVAIL"
    ? `HOST=${host} is not an address of this machine (set HOST, e.g. 0.0.0.0 or 127.0.0.1)`
    : `cannot listen on ${host}:${port}: ${error.message}`
  return new StartupFailure({ message, cause: error })
}

/**
 * The one line a process prints when it cannot start: a refused setting, or any failure that
 * carries a message (a start-up failure, a bus it cannot connect to). Defects are not handled here.
 */
export const failureLine = (error: unknown): string =>
  ConfigError.isConfigError(error)
    ? describe(error)
    : typeof error === "object" && error !== null && "message" in error && typeof error.message === "string"
    ? error.message.replace(/\s+/g, " ")
    : String(error)
