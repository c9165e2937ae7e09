/**
 * The Origin and Host rules on their own, for each deployment shape: an edge on loopback with no
 * settings (`npm start`), one behind `EDGE_PUBLIC_URL`, one bound to all addresses, and an explicit
 * `ALLOWED_ORIGINS`. The real-socket tests (`test/src/origin-host.test.ts`) show both paths use them.
 */
import { describe, expect, it } from "@effect/vitest"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as EdgeConfig from "../src/Config.ts"
import * as OriginPolicy from "../src/OriginPolicy.ts"
import { loggable, tokenTooLong } from "../src/Requests.ts"

const policy = (options: Partial<{ origins: ReadonlyArray<string>; bind: string; publicUrl: string }> = {}) =>
  OriginPolicy.make({
    allowedOrigins: Option.fromNullable(options.origins),
    bindAddress: options.bind ?? "127.0.0.1",
    publicUrl: Option.fromNullable(options.publicUrl)
  })

const statusOf = (refusal: OriginPolicy.Refusal | undefined) => refusal?.status ?? "ok"

describe("the origin and host policy", () => {
  describe("Origin, with no ALLOWED_ORIGINS", () => {
    const p = policy()
    it("accepts requests without Origin: no browser sent them", () => {
      expect(statusOf(p.checkOrigin(undefined))).toBe("ok")
    })
    it("accepts browser extensions' pages", () => {
      for (const o of ["chrome-extension://abcdefghijklmnopabcdefghijklmnop", "moz-extension://0b9f3a3e-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "safari-web-extension://X"]) {
        expect([o, statusOf(p.checkOrigin(o))]).toEqual([o, "ok"])
      }
    })
    it("accepts pages served from loopback, on any port, over http or https", () => {
      for (const o of ["http://localhost", "http://localhost:3000", "https://127.0.0.1:8443", "http://[::1]:5173", "HTTP://LOCALHOST:1"]) {
        expect([o, statusOf(p.checkOrigin(o))]).toEqual([o, "ok"])
      }
    })
    it("refuses every other web origin with 403, saying how to allow it", () => {
      for (const o of ["https://evil.example", "http://localhost.evil.example", "http://127.0.0.1.evil.example", "null", "file://", "ftp://localhost", "http://10.0.0.1"]) {
        expect([o, statusOf(p.checkOrigin(o))]).toEqual([o, 403])
      }
      expect(p.checkOrigin("https://evil.example")?.message).toBe(
        "origin https://evil.example is not allowed (without ALLOWED_ORIGINS only browser extensions and loopback pages are)"
      )
      expect(p.anyOrigin).toBe(false)
    })
    it("accepts the edge's own public origin when EDGE_PUBLIC_URL is set (the /embed page opens /hub from there)", () => {
      const behind = policy({ publicUrl: "https://mcp.example.com/", bind: "0.0.0.0" })
      expect(statusOf(behind.checkOrigin("https://mcp.example.com"))).toBe("ok")
      expect(statusOf(behind.checkOrigin("https://other.example.com"))).toBe(403)
    })
  })

  describe("Origin, with ALLOWED_ORIGINS", () => {
    it("accepts exactly the listed origins (in any case), and no extension or loopback page besides", () => {
      const p = policy({ origins: ["https://app.example.com", "chrome-extension://abc"] })
      expect(statusOf(p.checkOrigin("https://app.example.com"))).toBe("ok")
      expect(statusOf(p.checkOrigin("HTTPS://APP.EXAMPLE.COM"))).toBe("ok")
      expect(statusOf(p.checkOrigin("chrome-extension://abc"))).toBe("ok")
      expect(statusOf(p.checkOrigin("chrome-extension://other"))).toBe(403)
      expect(statusOf(p.checkOrigin("http://localhost:3000"))).toBe(403)
      expect(p.checkOrigin("https://evil.example")?.message).toBe("origin https://evil.example is not allowed")
      expect(statusOf(p.checkOrigin(undefined))).toBe("ok")
    })
    it("accepts any origin with *, by choice", () => {
      const p = policy({ origins: ["*"] })
      expect(p.anyOrigin).toBe(true)
      expect(statusOf(p.checkOrigin("https://evil.example"))).toBe("ok")
      expect(p.summary).toContain("origins: any (*)")
    })
    it("names what is wrong with a setting that is no origin", () => {
      expect(OriginPolicy.originError("https://app.example.com")).toBeUndefined()
      expect(OriginPolicy.originError("chrome-extension://abc")).toBeUndefined()
      expect(OriginPolicy.originError("*")).toBeUndefined()
      expect(OriginPolicy.originError("https://app.example.com/")).toBe(`"https://app.example.com/" has a trailing /; an origin is scheme://host[:port]`)
      expect(OriginPolicy.originError("app.example.com")).toBe(`"app.example.com" is not an origin (scheme://host[:port]) or *`)
    })
  })

  describe("Host", () => {
    it("parses host [\":\" port] as RFC 9110 allows, and nothing else", () => {
      expect(OriginPolicy.parseHost("LocalHost:8080")).toEqual({ hostname: "localhost", port: "8080" })
      expect(OriginPolicy.parseHost("[::1]:80")).toEqual({ hostname: "[::1]", port: "80" })
      expect(OriginPolicy.parseHost("10.1.2.3")).toEqual({ hostname: "10.1.2.3", port: undefined })
      expect(OriginPolicy.parseHost("a-b.example:")).toEqual({ hostname: "a-b.example", port: undefined })
      for (const bad of ['evil"', 'x", error="injected', "a b", "a/b", "a@b", "[::1", "::1", "x:99999", "x:80:80", "", "é.example", "x".repeat(301), "a\\b"]) {
        expect([bad, OriginPolicy.parseHost(bad)]).toEqual([bad, undefined])
      }
    })

    it("on loopback with no EDGE_PUBLIC_URL, takes only loopback names (with any port): a rebound DNS name is refused 403", () => {
      const p = policy()
      for (const h of ["localhost", "localhost:8080", "127.0.0.1:1", "[::1]:8080", "LOCALHOST"]) {
        expect([h, statusOf(p.checkHost(h, false))]).toEqual([h, "ok"])
      }
      for (const h of ["evil.example:8080", "localhost.evil.example", "127.0.0.2", "10.0.0.1:8080"]) {
        expect([h, statusOf(p.checkHost(h, false))]).toEqual([h, 403])
      }
      expect(p.checkHost("evil.example:8080", false)?.message).toMatch(/^Host evil\.example:8080 is not allowed: this edge listens on loopback, so a request must name localhost, 127\.0\.0\.1, \[::1\]/)
      expect(p.checkHost(undefined, false)).toEqual({ status: 400, message: "a Host header is required" })
    })

    it("refuses a malformed Host with 400 in every shape, without echoing it", () => {
      for (const p of [policy(), policy({ bind: "0.0.0.0" }), policy({ publicUrl: "https://mcp.example.com" })]) {
        expect(p.checkHost('x", error="injected', false)).toEqual({ status: 400, message: "malformed Host header" })
        expect(p.checkHost('x", error="injected', true)).toEqual({ status: 400, message: "malformed Host header" })
      }
    })

    it("lets probes (/healthz, /readyz, /metrics) name any well-formed host: kubelets name a pod by its address", () => {
      expect(statusOf(policy().checkHost("10.0.0.7:8080", true))).toBe("ok")
      expect(statusOf(policy({ publicUrl: "https://mcp.example.com" }).checkHost("10.0.0.7:8080", true))).toBe("ok")
    })

    it("behind EDGE_PUBLIC_URL takes its host name (any port), and loopback names too while bound to loopback", () => {
      const pub = policy({ publicUrl: "https://mcp.example.com/", bind: "0.0.0.0" })
      expect(statusOf(pub.checkHost("mcp.example.com", false))).toBe("ok")
      expect(statusOf(pub.checkHost("MCP.example.com:443", false))).toBe("ok")
      expect(statusOf(pub.checkHost("localhost:8080", false))).toBe(403)
      expect(pub.checkHost("evil.example", false)?.message).toBe("Host evil.example is not allowed: this edge serves mcp.example.com (EDGE_PUBLIC_URL)")
      const tunnel = policy({ publicUrl: "https://mcp.example.com" })
      expect(statusOf(tunnel.checkHost("localhost:8080", false))).toBe("ok")
      expect(statusOf(tunnel.checkHost("evil.example", false))).toBe(403)
    })

    it("bound to a public address with no EDGE_PUBLIC_URL, takes any well-formed host", () => {
      for (const bind of ["0.0.0.0", "::", "10.0.0.7"]) {
        const p = policy({ bind })
        expect(statusOf(p.checkHost("edge.internal:8080", false))).toBe("ok")
        expect(statusOf(p.checkHost(undefined, false))).toBe("ok")
        expect(p.summary).toContain("hosts: any")
      }
    })

    it("knows loopback bind addresses", () => {
      for (const a of ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"]) expect([a, OriginPolicy.isLoopbackAddress(a)]).toEqual([a, true])
      for (const a of ["0.0.0.0", "::", "10.0.0.1", "128.0.0.1", "localhost.example"]) expect([a, OriginPolicy.isLoopbackAddress(a)]).toEqual([a, false])
    })
  })

  describe("the base URL written into WWW-Authenticate and the resource metadata", () => {
    it("is EDGE_PUBLIC_URL without a trailing /, or the Host only when it is well-formed", () => {
      expect(policy({ publicUrl: "https://mcp.example.com/" }).baseUrl("evil.example")).toBe("https://mcp.example.com")
      expect(policy({ publicUrl: "https://example.com/gw/" }).baseUrl(undefined)).toBe("https://example.com/gw")
      expect(policy().baseUrl("127.0.0.1:8080")).toBe("http://127.0.0.1:8080")
      expect(policy().baseUrl('x", error="injected')).toBe("http://localhost")
    })
    it("is quoted as a quoted-string, so a value cannot close it", () => {
      expect(OriginPolicy.quoted(`a"b\\c`)).toBe(`"a\\"b\\\\c"`)
    })
  })
})

/** A setting as the edge reads it from `env`, or the message it is refused with. */
const read = <A>(setting: Effect.Effect<A, unknown>, env: Readonly<Record<string, string>>) =>
  Effect.runSync(
    setting.pipe(
      Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env)))),
      Effect.catchAll((e) => Effect.succeed(`refused: ${String(e)}`))
    )
  )

describe("the settings", () => {
  it("ALLOWED_ORIGINS: unset or empty is the default rule; a list is kept; what is no origin is refused, naming it", () => {
    expect(read(EdgeConfig.allowedOrigins, {})).toEqual(Option.none())
    expect(read(EdgeConfig.allowedOrigins, { ALLOWED_ORIGINS: " , " })).toEqual(Option.none())
    expect(read(EdgeConfig.allowedOrigins, { ALLOWED_ORIGINS: "https://a.example, chrome-extension://abc" })).toEqual(
      Option.some(["https://a.example", "chrome-extension://abc"])
    )
    expect(read(EdgeConfig.allowedOrigins, { ALLOWED_ORIGINS: "*" })).toEqual(Option.some(["*"]))
    expect(read(EdgeConfig.allowedOrigins, { ALLOWED_ORIGINS: "https://a.example/" })).toContain(
      `ALLOWED_ORIGINS: "https://a.example/" has a trailing /; an origin is scheme://host[:port]`
    )
  })
  it("EDGE_PUBLIC_URL must be an http(s) URL; EDGE_MAX_TOKEN_BYTES defaults to 8 KiB", () => {
    expect(read(EdgeConfig.publicUrl, { EDGE_PUBLIC_URL: "https://mcp.example.com/" })).toEqual(Option.some("https://mcp.example.com/"))
    expect(read(EdgeConfig.publicUrl, { EDGE_PUBLIC_URL: "mcp.example.com" })).toContain(
      `EDGE_PUBLIC_URL must be an http(s) URL without query or credentials, got "mcp.example.com"`
    )
    expect(read(EdgeConfig.maxTokenBytes, {})).toBe(8192)
    expect(read(EdgeConfig.maxTokenBytes, { EDGE_MAX_TOKEN_BYTES: "0" })).toContain("EDGE_MAX_TOKEN_BYTES must be a whole number > 0")
  })
})

describe("what a log line shows of a request target", () => {
  it("leaves out a token's value however its name is spelt, as the server decodes it", () => {
    expect(loggable("/tabs?token=abc.def")).toBe("/tabs?token=…")
    expect(loggable("/tabs?%74oken=abc.def&x=1")).toBe("/tabs?%74oken=…&x=1")
    expect(loggable("/tabs?x=1&t%6F%6Ben=abc#frag")).toBe("/tabs?x=1&t%6F%6Ben=…#frag")
    expect(loggable("/tabs?TOKEN=abc&access_token=def")).toBe("/tabs?TOKEN=…&access_token=…")
    expect(loggable("/tabs?tokens=kept&%zz=kept")).toBe("/tabs?tokens=kept&%zz=kept")
    expect(loggable("/plain")).toBe("/plain")
    expect(loggable(undefined)).toBe("")
    // What the upgrade reads as the token is exactly what is left out.
    const target = "/tabs?%74oken=secret.jwt"
    expect(new URL(target, "http://edge").searchParams.get("token")).toBe("secret.jwt")
    expect(loggable(target)).not.toContain("secret")
  })
})

describe("the token length cap", () => {
  it("refuses a token over the cap, counting bytes, and says by how much", () => {
    expect(tokenTooLong("x".repeat(8192), 8192)).toBeUndefined()
    expect(tokenTooLong("x".repeat(8193), 8192)).toBe("token too long: 8193 bytes, at most 8192")
    expect(tokenTooLong("é".repeat(4097), 8192)).toBe("token too long: 8194 bytes, at most 8192")
  })
})
