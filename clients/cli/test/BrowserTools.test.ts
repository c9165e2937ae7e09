import { describe, expect, it } from "@effect/vitest"
import * as Either from "effect/Either"
import { Backoff } from "@switchboard/protocol/browser/Backoff"
import { browserTools, byName, imageOf } from "../src/BrowserTools.ts"

describe("BrowserTools", () => {
  it("reads a screenshot from each shape extensions answer with", () => {
    expect(imageOf({ data: "AAA", mimeType: "image/jpeg" })).toEqual({ data: "AAA", mimeType: "image/jpeg" })
    expect(imageOf({ data: "AAA" })).toEqual({ data: "AAA", mimeType: "image/png" })
    expect(imageOf({ data: "AAA", format: "webp" })).toEqual({ data: "AAA", mimeType: "image/webp" })
    expect(imageOf({ screenshot: "data:image/png;base64,QUJD" })).toEqual({ data: "QUJD", mimeType: "image/png" })
    expect(imageOf("data:image/jpeg;base64,QUJD")).toEqual({ data: "QUJD", mimeType: "image/jpeg" })
    expect(imageOf({ result: "nothing" })).toBeUndefined()
    expect(byName.get("browser_screenshot")?.answer({})).toMatchObject({ isError: true })
  })

  it("checks the host's arguments against the advertised schema, and passes only what was given", () => {
    const navigate = byName.get("browser_navigate")
    expect(navigate?.method).toBe("browser_navigate")
    expect(navigate?.params({ url: "https://a.example/" })).toEqual(Either.right({ url: "https://a.example/" }))
    expect(navigate?.params({ url: "https://a.example/", tabId: 3 })).toEqual(Either.right({ url: "https://a.example/", tabId: 3 }))
    expect(Either.isLeft(navigate?.params({}) ?? Either.right({}))).toBe(true)
    expect(Either.isLeft(navigate?.params({ url: "x", extra: 1 }) ?? Either.right({}))).toBe(true)
    expect(byName.get("browser_get_tabs")?.params(undefined)).toEqual(Either.right({}))
    for (const { tool } of browserTools) {
      expect(tool.inputSchema.type).toBe("object")
      for (const required of tool.inputSchema.required ?? []) expect(Object.keys(tool.inputSchema.properties ?? {})).toContain(required)
    }
  })

  it("backs off from 250 ms to 10 s, jittered within the upper half of each step, and resets", () => {
    const low = new Backoff({ random: () => 0 })
    expect(Array.from({ length: 8 }, () => low.next())).toEqual([125, 250, 500, 1000, 2000, 4000, 5000, 5000])
    const high = new Backoff({ random: () => 1 })
    expect(Array.from({ length: 8 }, () => high.next())).toEqual([250, 500, 1000, 2000, 4000, 8000, 10000, 10000])
    high.reset()
    expect(high.next()).toBe(250)
  })
})
