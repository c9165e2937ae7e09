// Pins what each setting helper accepts and the one-line refusal it gives, since that line is all a
// person sees when `npm start` refuses a value.
import { describe, expect, it } from "@effect/vitest"
import * as Config from "effect/Config"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Settings from "../src/Settings.ts"

const read = <A>(config: Config.Config<A>, env: Record<string, string>) =>
  Effect.runSync(
    Effect.either(Effect.withConfigProvider(config, ConfigProvider.fromMap(new Map(Object.entries(env))))).pipe(
      Effect.map(Either.mapLeft(Settings.describe))
    )
  )

const size = Settings.positiveInt("X_SIZE", 10, "a size")
const limit = Settings.nonNegativeInt("X_LIMIT", 5, "a limit", "no limit")
const rate = Settings.positiveNumber("X_RATE", 100, "a rate")
const burst = Settings.atLeast("X_BURST", 200, "a burst", rate, "X_RATE")
const wait = Settings.duration("X_WAIT", "5 seconds", "a timeout")
const pause = Settings.nonNegativeDuration("X_PAUSE", "1 second", "a pause")
const port = Settings.intBetween("X_PORT", 0, 65535, 8080, "a port")
const beat = Settings.livenessInterval("X_BEAT", "2 seconds", "6 seconds", "a heartbeat")

describe("Settings", () => {
  it("uses the default when unset", () => {
    expect(read(size, {})).toStrictEqual(Either.right(10))
    expect(read(limit, {})).toStrictEqual(Either.right(5))
    expect(read(burst, {})).toStrictEqual(Either.right(200))
    expect(read(wait, {}).pipe(Either.map(Duration.toMillis))).toStrictEqual(Either.right(5_000))
  })

  it.each([
    ["30s", 30_000],
    ["5m", 300_000],
    ["1h", 3_600_000],
    ["250ms", 250],
    ["2d", 172_800_000],
    ["1.5s", 1_500],
    [" 10 s ", 10_000],
    ["30 seconds", 30_000],
    ["200 millis", 200],
    ["1 minute", 60_000]
  ])("reads the duration %j", (text, millis) => {
    expect(read(wait, { X_WAIT: text }).pipe(Either.map(Duration.toMillis))).toStrictEqual(Either.right(millis))
  })

  it.each([
    [size, { X_SIZE: "-1" }, "X_SIZE must be a whole number > 0, got -1"],
    [size, { X_SIZE: "0" }, "X_SIZE must be a whole number > 0, got 0"],
    [size, { X_SIZE: "1.5" }, "X_SIZE must be a whole number > 0, got 1.5"],
    [size, { X_SIZE: "lots" }, "X_SIZE must be a whole number > 0, got lots"],
    [size, { X_SIZE: "" }, "X_SIZE must be a whole number > 0, got \"\""],
    [limit, { X_LIMIT: "-1" }, "X_LIMIT must be a whole number >= 0 (0 is no limit), got -1"],
    [rate, { X_RATE: "0" }, "X_RATE must be a number > 0, got 0"],
    [rate, { X_RATE: "Infinity" }, "X_RATE must be a number > 0, got Infinity"],
    [burst, { X_RATE: "500" }, "X_BURST must be at least X_RATE (500), got 200"],
    [port, { X_PORT: "70000" }, "X_PORT must be a whole number from 0 to 65535, got 70000"],
    [wait, { X_WAIT: "soon" }, "X_WAIT must be a duration such as 30s, 5m, 1h, 250ms, 2d or 30 seconds, got soon"],
    [wait, { X_WAIT: "-5s" }, "X_WAIT must be a duration such as 30s, 5m, 1h, 250ms, 2d or 30 seconds, got -5s"],
    [wait, { X_WAIT: "5" }, "X_WAIT must be a duration such as 30s, 5m, 1h, 250ms, 2d or 30 seconds, got 5"],
    [wait, { X_WAIT: "0s" }, "X_WAIT must be a duration such as 30s, 5m, 1h, 250ms, 2d or 30 seconds, more than 0, got 0s"],
    [beat, { X_BEAT: "4s" }, "X_BEAT must be at most 3s (half the 6s life of the key it renews), got 4s"],
    [beat, { X_BEAT: "0s" }, "X_BEAT must be a duration such as 30s, 5m, 1h, 250ms, 2d or 30 seconds, more than 0, got 0s"]
  ] as const)("refuses %#: %j", (config: Config.Config<unknown>, env, message) => {
    expect(read(config, env)).toStrictEqual(Either.left(message))
  })

  it("takes a liveness interval up to half its key's life", () => {
    expect(read(beat, { X_BEAT: "3s" }).pipe(Either.map(Duration.toMillis))).toStrictEqual(Either.right(3_000))
  })

  it("takes 0 where 0 means none", () => {
    expect(read(limit, { X_LIMIT: "0" })).toStrictEqual(Either.right(0))
    expect(read(pause, { X_PAUSE: "0s" }).pipe(Either.map(Duration.toMillis))).toStrictEqual(Either.right(0))
  })

  it("names every bad value on one line", () => {
    expect(read(Config.all([size, rate]), { X_SIZE: "-1", X_RATE: "0" })).toStrictEqual(
      Either.left("X_SIZE must be a whole number > 0, got -1; X_RATE must be a number > 0, got 0")
    )
  })
})

describe("Settings.flag and Settings.optionalDuration", () => {
  const required = Settings.flag("X_REQUIRED", true, "a switch")
  const most = Settings.optionalDuration("X_MOST", "a limit, off unless set")

  it("reads a flag in the usual spellings, and refuses anything else by name", () => {
    expect(read(required, {})).toStrictEqual(Either.right(true))
    for (const off of ["false", "FALSE", "off", "no", "0", " false "]) expect(read(required, { X_REQUIRED: off })).toStrictEqual(Either.right(false))
    for (const on of ["true", "On", "yes", "1"]) expect(read(required, { X_REQUIRED: on })).toStrictEqual(Either.right(true))
    expect(read(required, { X_REQUIRED: "maybe" })).toStrictEqual(Either.left('X_REQUIRED must be true or false, got maybe'))
    expect(read(required, { X_REQUIRED: "constructor" })).toStrictEqual(Either.left('X_REQUIRED must be true or false, got constructor'))
  })

  it("reads an optional duration: none when unset, refused when not a duration > 0", () => {
    expect(read(most, {}).pipe(Either.map(Option.map(Duration.toMillis)))).toStrictEqual(Either.right(Option.none()))
    expect(read(most, { X_MOST: "1d" }).pipe(Either.map(Option.map(Duration.toMillis)))).toStrictEqual(Either.right(Option.some(86_400_000)))
    expect(read(most, { X_MOST: "0s" })).toStrictEqual(Either.left("X_MOST must be a duration such as 30s, 5m, 1h, 250ms, 2d or 30 seconds, more than 0, got 0s"))
    expect(read(most, { X_MOST: "soon" })).toStrictEqual(
      Either.left("X_MOST must be a duration such as 30s, 5m, 1h, 250ms, 2d or 30 seconds, got soon")
    )
  })
})
