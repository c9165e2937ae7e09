import { afterEach, beforeEach, describe, expect, it, vi } from "vitest"
import { TimedMap } from "../src/TimedMap.ts"

// The map's clock is performance.now and its timer setTimeout: both run on a fake clock here, so
// each expectation is about exact times, not about how long a sleep took on a busy machine.
beforeEach(() => {
  vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "performance"] })
})
afterEach(() => {
  vi.useRealTimers()
})

describe("TimedMap", () => {
  it("expires entries in the order they were set, each exactly its duration after it was set", () => {
    const expired: Array<readonly [string, number, number]> = []
    const start = performance.now()
    const map = new TimedMap<string, number>(200, (key, value) => expired.push([key, value, performance.now() - start]))
    map.set("a", 1)
    vi.advanceTimersByTime(100)
    map.set("b", 2)
    expect(map.size).toBe(2)
    vi.advanceTimersByTime(99)
    expect(expired).toEqual([])
    vi.advanceTimersByTime(1)
    expect(expired).toEqual([["a", 1, 200]])
    expect(map.has("a")).toBe(false)
    expect(map.get("b")).toBe(2)
    vi.advanceTimersByTime(100)
    expect(expired).toEqual([["a", 1, 200], ["b", 2, 300]])
    expect(map.size).toBe(0)
  })

  it("never expires what was deleted or cleared, and restarts the time of an entry set again", () => {
    const expired: Array<string> = []
    const map = new TimedMap<string, string>(200, (key) => expired.push(key))
    map.set("deleted", "x")
    map.set("renewed", "x")
    map.set("cleared-later", "x")
    expect(map.delete("deleted")).toBe(true)
    vi.advanceTimersByTime(100)
    map.set("renewed", "y")
    vi.advanceTimersByTime(150)
    // "cleared-later" went at 200 ms; "renewed" lives until 300 ms.
    expect(expired).toEqual(["cleared-later"])
    expect(map.get("renewed")).toBe("y")
    map.clear()
    vi.advanceTimersByTime(1_000)
    expect(expired).toEqual(["cleared-later"])
    expect([...map.values()]).toEqual([])
  })

  it("lets the expiry callback set new entries, which get their own full time", () => {
    const expired: Array<string> = []
    const start = performance.now()
    const map = new TimedMap<string, number>(30, (key, attempt) => {
      expired.push(`${key}#${attempt}@${performance.now() - start}`)
      if (attempt < 3) map.set(key, attempt + 1)
    })
    map.set("retry", 1)
    vi.advanceTimersByTime(1_000)
    expect(expired).toEqual(["retry#1@30", "retry#2@60", "retry#3@90"])
    expect(map.size).toBe(0)
  })

  it("keeps the shared in-flight counts: pending through set, replace, delete, clear and expiry; timeouts on expiry only", () => {
    const inFlight = { pending: { value: 0 }, timeouts: { value: 0 } }
    const a = new TimedMap<string, number>(200, () => {}, inFlight)
    const b = new TimedMap<string, number>(200, () => {}, inFlight)
    a.set("1", 1)
    a.set("1", 2) // replaced, still one request
    a.set("2", 1)
    b.set("1", 1)
    expect(inFlight.pending.value).toBe(3)
    expect(a.delete("2")).toBe(true)
    expect(a.delete("2")).toBe(false)
    expect(inFlight.pending.value).toBe(2)
    b.clear()
    expect(inFlight.pending.value).toBe(1)
    vi.advanceTimersByTime(200)
    expect(inFlight).toEqual({ pending: { value: 0 }, timeouts: { value: 1 } })
  })
})
