import { describe, expect, it } from "vitest"
import { TimedMap } from "../src/TimedMap.ts"

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

describe("TimedMap", () => {
  it("expires entries in the order they were set, each about its own duration after it was set", async () => {
    const expired: Array<readonly [string, number, number]> = []
    const start = performance.now()
    const map = new TimedMap<string, number>(200, (key, value) => expired.push([key, value, performance.now() - start]))
    map.set("a", 1)
    await sleep(100)
    map.set("b", 2)
    expect(map.size).toBe(2)
    await sleep(150)
    expect(expired.map(([k, v]) => [k, v])).toEqual([["a", 1]])
    expect(map.has("a")).toBe(false)
    expect(map.get("b")).toBe(2)
    await sleep(150)
    expect(expired.map(([k]) => k)).toEqual(["a", "b"])
    expect(expired[0]![2]).toBeGreaterThanOrEqual(199)
    expect(expired[1]![2]).toBeGreaterThanOrEqual(299)
    expect(map.size).toBe(0)
  })

  it("never expires what was deleted or cleared, and restarts the time of an entry set again", async () => {
    const expired: Array<string> = []
    const map = new TimedMap<string, string>(200, (key) => expired.push(key))
    map.set("deleted", "x")
    map.set("renewed", "x")
    map.set("cleared-later", "x")
    expect(map.delete("deleted")).toBe(true)
    await sleep(100)
    map.set("renewed", "y")
    await sleep(150)
    // "cleared-later" went at 200 ms; "renewed" lives until 300 ms.
    expect(expired).toEqual(["cleared-later"])
    expect(map.get("renewed")).toBe("y")
    map.clear()
    await sleep(100)
    expect(expired).toEqual(["cleared-later"])
    expect([...map.values()]).toEqual([])
  })

  it("lets the expiry callback set new entries, which get their own full time", async () => {
    const expired: Array<string> = []
    const map = new TimedMap<string, number>(30, (key, attempt) => {
      expired.push(`${key}#${attempt}`)
      if (attempt < 3) map.set(key, attempt + 1)
    })
    map.set("retry", 1)
    await sleep(300)
    expect(expired).toEqual(["retry#1", "retry#2", "retry#3"])
    expect(map.size).toBe(0)
  })
})
