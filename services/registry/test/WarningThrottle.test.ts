/** At most one warning per interval per connection, and the next one says how many were held back. */
import { describe, expect, it } from "@effect/vitest"
import { WarningThrottle } from "../src/WarningThrottle.ts"

describe("WarningThrottle", () => {
  it("lets the first warning out, holds back the rest of the interval, and counts them in the next", () => {
    let now = 1_000
    const throttle = new WarningThrottle(10_000, () => now)
    expect(throttle.admit("a")).toBe("a")
    now += 9_999
    expect(throttle.admit("b")).toBeUndefined()
    expect(throttle.admit("c")).toBeUndefined()
    now += 1
    expect(throttle.admit("d")).toBe("d (and 2 similar warning(s) held back since the last one)")
    now += 10_000
    expect(throttle.admit("e")).toBe("e")
  })
})
