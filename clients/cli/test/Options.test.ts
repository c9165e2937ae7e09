import { describe, expect, it } from "@effect/vitest"
import { parse } from "../src/Options.ts"

const run = (argv: ReadonlyArray<string>, env: Record<string, string> = {}) => {
  const parsed = parse(argv, env)
  if (parsed._tag !== "Run") throw new Error(`expected Run, got ${JSON.stringify(parsed)}`)
  return parsed.options
}

describe("Options", () => {
  it("derives /hub and /mcp from the base URL, keeping a path prefix and the scheme's security", () => {
    const local = run(["--url", "http://127.0.0.1:8080", "--token", "t"])
    expect([local.url, local.hubUrl.href, local.proxyUrl.href]).toEqual(["http://127.0.0.1:8080", "ws://127.0.0.1:8080/hub", "ws://127.0.0.1:8080/mcp"])
    expect(local.hubHttpUrl.href).toBe("http://127.0.0.1:8080/hub")
    const behind = run(["--url=https://example.com/switchboard/?x=1", "--token=t"])
    expect([behind.hubUrl.href, behind.proxyUrl.href]).toEqual(["wss://example.com/switchboard/hub", "wss://example.com/switchboard/mcp"])
    expect(behind.hubHttpUrl.href).toBe("https://example.com/switchboard/hub")
  })

  it("falls back to SWITCHBOARD_* variables, and options win over them", () => {
    const env = { SWITCHBOARD_URL: "http://env:1", SWITCHBOARD_TOKEN: "env-token", SWITCHBOARD_EXTENSION: "Chrome 141" }
    expect(run([], env)).toMatchObject({ url: "http://env:1", token: "env-token", extension: "Chrome 141", browser: true })
    expect(run(["--url", "http://arg:2", "--token", "arg", "--extension", "ext-1", "--no-browser"], env)).toMatchObject({
      url: "http://arg:2",
      token: "arg",
      extension: "ext-1",
      browser: false
    })
  })

  it("says what is wrong with a bad command line", () => {
    const message = (argv: ReadonlyArray<string>) => {
      const parsed = parse(argv, {})
      return parsed._tag === "Invalid" ? parsed.message : parsed._tag
    }
    expect(message(["--token", "t"])).toContain("missing --url")
    expect(message(["--url", "http://x:1"])).toContain("missing --token")
    expect(message(["--url", "not a url", "--token", "t"])).toContain("is not a URL")
    expect(message(["--url", "ftp://x", "--token", "t"])).toContain("not ftp:")
    expect(message(["--frobnicate"])).toContain("Unknown option '--frobnicate'")
    expect(message(["stray"])).toContain("stray")
    expect(message(["--help", "--url", "x"])).toBe("Help")
    expect(message(["--version"])).toBe("Version")
  })
})
