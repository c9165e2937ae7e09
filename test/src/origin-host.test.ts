/**
 * `npm start` as shipped (no ALLOWED_ORIGINS, no EDGE_PUBLIC_URL, bound to loopback), attacked
 * from a browser's angle over real sockets (issue 26): a foreign page's Origin, a DNS name rebound
 * to 127.0.0.1, a `Host` that tries to inject auth-params, a token spelt `%74oken` to reach the
 * logs, and tokens far longer than any JWT, on upgrades and on plain HTTP alike.
 */
import { describe, expect, layer } from "@effect/vitest"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Http from "node:http"
import { connect, UpgradeRefused } from "./support/Client.ts"
import * as Processes from "./support/Processes.ts"
import { namespace, token } from "./support/Stack.ts"
import { until } from "./support/Until.ts"

class Shipped extends Context.Tag("test/origin-host/Shipped")<Shipped, Processes.EdgeProcess>() {}

/** One all-in-one with no settings but the test harness's own (free ports, the test secret). */
const shipped = Layer.scoped(Shipped, Processes.allInOne({ namespace: namespace() }))

interface Answer {
  readonly status: number
  readonly headers: Http.IncomingHttpHeaders
  readonly body: string
}

/**
 * One request with exactly these headers, Host included (fetch will not send a Host of our choosing),
 * to the edge at 127.0.0.1.
 */
const send = (port: number, method: string, path: string, headers: Readonly<Record<string, string>>, body?: string) =>
  Effect.async<Answer>((resume) => {
    const req = Http.request({ host: "127.0.0.1", port, method, path, headers, agent: false }, (res) => {
      let text = ""
      res.setEncoding("utf8").on("data", (chunk: string) => (text += chunk))
      res.on("end", () => resume(Effect.succeed({ status: res.statusCode ?? 0, headers: res.headers, body: text })))
    })
    req.on("error", (e) => resume(Effect.die(e)))
    req.end(body)
  })

const INIT = JSON.stringify({
  jsonrpc: "2.0",
  id: 1,
  method: "initialize",
  params: { protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "origin-host", version: "0" } }
})
const postHeaders = { "content-type": "application/json", accept: "application/json, text/event-stream" }

/** An upgrade's outcome: "accepted", or the HTTP status and body it was refused with. */
const upgrade = (url: string, headers: Readonly<Record<string, string>> = {}, origin?: string) =>
  Effect.scoped(connect(url, { headers, ...(origin === undefined ? {} : { origin }) })).pipe(
    Effect.as("accepted" as const),
    Effect.catchAll((e) => Effect.succeed(e instanceof UpgradeRefused ? { status: e.status, body: e.body } : { status: 0, body: String(e) }))
  )

layer(shipped, { excludeTestServices: true, timeout: "90 seconds" })("npm start with no settings", (it) => {
  describe("Origin", () => {
    it.scoped("an upgrade from a foreign web page is refused 403; extensions, loopback pages and non-browsers are accepted", () =>
      Effect.gen(function*() {
        const edge = yield* Shipped
        expect(yield* upgrade(`${edge.ws}/mcp`, {}, "https://evil.example")).toEqual({
          status: 403,
          body: "origin https://evil.example is not allowed (without ALLOWED_ORIGINS only browser extensions and loopback pages are)"
        })
        expect(yield* upgrade(`${edge.ws}/extension`, {}, "chrome-extension://abcdefghijklmnopabcdefghijklmnop")).toBe("accepted")
        expect(yield* upgrade(`${edge.ws}/mcp`, {}, "moz-extension://0b9f3a3e-1c2d-4e5f-8a9b-0c1d2e3f4a5b")).toBe("accepted")
        expect(yield* upgrade(`${edge.ws}/mcp`, {}, "http://127.0.0.1:5173")).toBe("accepted")
        expect(yield* upgrade(`${edge.ws}/mcp`, {}, "http://localhost:3000")).toBe("accepted")
        expect(yield* upgrade(`${edge.ws}/mcp`)).toBe("accepted")
      }))

    it.scoped("a Streamable HTTP request from a foreign web page is refused 403; extensions, loopback pages and non-browsers are answered", () =>
      Effect.gen(function*() {
        const edge = yield* Shipped
        const authorization = `Bearer ${yield* token({ sub: "origin-user" })}`
        const post = (origin?: string) =>
          send(edge.port, "POST", "/hub", { ...postHeaders, authorization, ...(origin === undefined ? {} : { origin }) }, INIT)
        const foreign = yield* post("https://evil.example")
        expect(foreign.status).toBe(403)
        expect(foreign.body).toContain("origin https://evil.example is not allowed")
        for (const origin of ["chrome-extension://abcdefghijklmnopabcdefghijklmnop", "http://127.0.0.1:5173", "http://[::1]:8080", undefined]) {
          expect([origin, (yield* post(origin)).status]).toEqual([origin, 200])
        }
      }))
  })

  describe("Host (DNS rebinding)", () => {
    it.scoped("a DNS name that resolves to the loopback edge is refused 403 on every path; loopback names are served", () =>
      Effect.gen(function*() {
        const edge = yield* Shipped
        const authorization = `Bearer ${yield* token({ sub: "rebind-user" })}`
        const rebound = "evil.example:8080"
        const hub = yield* send(edge.port, "POST", "/hub", { ...postHeaders, authorization, host: rebound }, INIT)
        expect(hub.status).toBe(403)
        expect(hub.body).toMatch(/^Host evil\.example:8080 is not allowed: this edge listens on loopback/)
        expect((yield* send(edge.port, "GET", "/v0/topics", { authorization, host: rebound })).status).toBe(403)
        expect((yield* send(edge.port, "GET", "/.well-known/oauth-protected-resource", { host: rebound })).status).toBe(403)
        expect((yield* upgrade(`${edge.ws}/mcp`, { host: rebound }))).toMatchObject({ status: 403 })
        expect((yield* upgrade(`${edge.ws}/hub?token=${authorization.slice(7)}`, { host: rebound }))).toMatchObject({ status: 403 })
        // Loopback names with any port are this machine's own clients.
        for (const host of ["localhost:1234", "127.0.0.1", "[::1]:8080"]) {
          expect([host, (yield* send(edge.port, "POST", "/hub", { ...postHeaders, authorization, host }, INIT)).status]).toEqual([host, 200])
        }
        expect(yield* upgrade(`${edge.ws}/mcp`, { host: "localhost" })).toBe("accepted")
        // Probes name a pod by its address: they need a well-formed Host only.
        expect((yield* send(edge.port, "GET", "/healthz", { host: "10.0.0.7:8080" })).status).toBe(200)
        expect((yield* send(edge.port, "GET", "/metrics", { host: "10.0.0.7:8080" })).status).toBe(200)
      }))

    it.scoped("a malformed Host is refused 400 and never written back, in a header or a document", () =>
      Effect.gen(function*() {
        const edge = yield* Shipped
        const injected = `127.0.0.1", error="insufficient_scope", scope="admin`
        for (const [method, path] of [["POST", "/hub"], ["GET", "/.well-known/oauth-protected-resource"], ["GET", "/v0/topics"], ["GET", "/healthz"]] as const) {
          const answer = yield* send(edge.port, method, path, { ...postHeaders, host: injected }, method === "POST" ? INIT : undefined)
          expect([path, answer.status, answer.body]).toEqual([path, 400, "malformed Host header\n"])
          expect(answer.headers["www-authenticate"]).toBeUndefined()
        }
        expect(yield* upgrade(`${edge.ws}/mcp`, { host: injected })).toEqual({ status: 400, body: "malformed Host header" })
        // A well-formed Host still names the metadata, quoted.
        const anonymous = yield* send(edge.port, "POST", "/hub", { ...postHeaders, host: "localhost:9" }, INIT)
        expect(anonymous.status).toBe(401)
        expect(anonymous.headers["www-authenticate"]).toBe(`Bearer resource_metadata="http://localhost:9/.well-known/oauth-protected-resource"`)
      }))
  })

  describe("tokens", () => {
    it.scoped("a token spelt %74oken in a refused upgrade's query is left out of the log line", () =>
      Effect.gen(function*() {
        const edge = yield* Shipped
        const secret = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXBheWxvYWQ.bm90LWEtc2lnbmF0dXJl"
        for (const target of [`/hub?%74oken=${secret}&n=1`, `/tabs?t%6Fken=${secret}&n=2`, `/hub?token=${secret}&n=3`]) {
          expect(yield* upgrade(`${edge.ws}${target}`)).toMatchObject({ status: 401 })
        }
        // The log comes through the child's stdout, which races the refusals' sockets.
        const refusals = () => edge.output().split("\n").filter((l) => l.includes("refused an upgrade with 401") && /&n=[123]\b/.test(l))
        yield* until(() => refusals().length >= 3, "three refused upgrades logged")
        const lines = refusals()
        expect(lines.find((l) => l.includes("/hub?%74oken=…&n=1"))).toBeDefined()
        expect(lines.find((l) => l.includes("/tabs?t%6Fken=…&n=2"))).toBeDefined()
        expect(lines.find((l) => l.includes("/hub?token=…&n=3"))).toBeDefined()
        expect(edge.output()).not.toContain(secret)
      }))

    it.scoped("a token over 8 KiB is refused 401 invalid_token at the edge on every path, even one auth would accept", () =>
      Effect.gen(function*() {
        const edge = yield* Shipped
        // Validly signed: only the edge's cap refuses it, auth never sees it.
        const long = yield* token({ sub: `long-${"x".repeat(9000)}` })
        const bytes = Buffer.byteLength(long)
        expect(bytes).toBeGreaterThan(8192)
        const why = `invalid token: token too long: ${bytes} bytes, at most 8192`
        const authorization = `Bearer ${long}`
        expect(yield* upgrade(`${edge.ws}/hub`, { authorization })).toEqual({ status: 401, body: why })
        expect(yield* upgrade(`${edge.ws}/tabs?token=${long}`)).toEqual({ status: 401, body: why })
        expect(yield* upgrade(`${edge.ws}/v0/ws`, { authorization })).toEqual({ status: 401, body: why })
        const hub = yield* send(edge.port, "POST", "/hub", { ...postHeaders, authorization }, INIT)
        expect(hub.status).toBe(401)
        expect(hub.body).toContain(why)
        expect(hub.headers["www-authenticate"]).toMatch(/^Bearer error="invalid_token", resource_metadata="http:\/\/127\.0\.0\.1:\d+\/\.well-known\/oauth-protected-resource"$/)
        for (const [method, path] of [["GET", "/v0/topics"], ["GET", "/v0/topics/t/history"], ["POST", "/admin/participants/p/promote"]] as const) {
          const answer = yield* send(edge.port, method, path, { authorization })
          expect([path, answer.status, answer.body]).toEqual([path, 401, JSON.stringify({ error: why })])
          expect(answer.headers["www-authenticate"]).toBe(`Bearer error="invalid_token"`)
        }
        // A token of ordinary size still goes through.
        const normal = `Bearer ${yield* token({ sub: "normal" })}`
        expect((yield* send(edge.port, "GET", "/v0/topics", { authorization: normal })).status).toBe(200)
      }))
  })
})
