/** The per-key cap on connections: slots are taken up to the limit and come back once each. */
import { describe, expect, it } from "@effect/vitest"
import { ConnectionLimit } from "../src/ConnectionLimit.ts"

describe("ConnectionLimit", () => {
  it("takes slots up to the limit per key, forces one past it, and frees each once", () => {
    const limit = new ConnectionLimit(2)
    const a = limit.take("alice")
    const b = limit.take("alice")
    expect(limit.take("alice")).toBeUndefined()
    expect(limit.take("bob")).toBeDefined()
    const forced = limit.take("alice", true)
    expect(limit.count("alice")).toBe(3)
    a?.()
    a?.()
    forced?.()
    expect(limit.count("alice")).toBe(1)
    b?.()
    expect(limit.count("alice")).toBe(0)
    expect(limit.count("bob")).toBe(1)
    expect(limit.take("alice")).toBeDefined()
  })

  it("with a limit of 0 refuses nothing and counts nothing", () => {
    const limit = new ConnectionLimit(0)
    for (let i = 0; i < 5; i++) expect(limit.take("alice")).toBeDefined()
    expect(limit.count("alice")).toBe(0)
  })

  it("takes and gives back slots without a function per slot", () => {
    const limit = new ConnectionLimit(1)
    expect(limit.tryTake("alice")).toBe(true)
    expect(limit.tryTake("alice")).toBe(false)
    expect(limit.tryTake("alice", true)).toBe(true)
    expect(limit.count("alice")).toBe(2)
    limit.give("alice")
    limit.give("alice")
    expect(limit.count("alice")).toBe(0)
    expect(limit.tryTake("alice")).toBe(true)
    const none = new ConnectionLimit(0)
    expect(none.tryTake("alice")).toBe(true)
    none.give("alice")
    expect(none.count("alice")).toBe(0)
  })
})
