import { describe, expect, it } from "@effect/vitest"
import { Modern } from "@switchboard/protocol"
import * as ModernRequest from "../src/ModernRequest.ts"

const V = "2026-07-28"
const meta = (extra: Record<string, unknown> = {}) => ({ [Modern.Meta.protocolVersion]: V, [Modern.Meta.clientCapabilities]: {}, ...extra })
const call = (name: string, m: Record<string, unknown> = meta()) => ({ jsonrpc: "2.0", id: 7, method: "tools/call", params: { name, arguments: {}, _meta: m } })
const headers = (extra: Record<string, string> = {}) => ({ "mcp-protocol-version": V, "mcp-method": "tools/call", "mcp-name": "a_b", ...extra })

describe("ModernRequest", () => {
  it("tells the eras apart: initialize and Mcp-Session-Id are legacy; _meta's version or a non-legacy header is modern", () => {
    expect(ModernRequest.isModern({}, { jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-11-25" } })).toBe(false)
    expect(ModernRequest.isModern({ "mcp-session-id": "x", "mcp-protocol-version": V }, call("a_b"))).toBe(false)
    expect(ModernRequest.isModern({ "mcp-protocol-version": "2025-06-18" }, { jsonrpc: "2.0", id: 1, method: "tools/list" })).toBe(false)
    expect(ModernRequest.isModern({}, { jsonrpc: "2.0", id: 1, method: "tools/list" })).toBe(false)
    expect(ModernRequest.isModern({}, call("a_b"))).toBe(true)
    expect(ModernRequest.isModern({ "mcp-protocol-version": "2099-01-01" }, { jsonrpc: "2.0", id: 1, method: "tools/list" })).toBe(true)
  })

  it("accepts a request whose headers match its body, with the Base64 sentinel form of Mcp-Name", () => {
    expect(ModernRequest.check(headers(), call("a_b"))).toEqual({ kind: "request", method: "tools/call", id: 7 })
    const name = "héllo wörld"
    const encoded = `=?base64?${Buffer.from(name).toString("base64")}?=`
    expect(ModernRequest.check(headers({ "mcp-name": encoded }), call(name))).toEqual({ kind: "request", method: "tools/call", id: 7 })
    const discover = { jsonrpc: "2.0", id: "d", method: "server/discover", params: { _meta: meta() } }
    expect(ModernRequest.check({ "mcp-protocol-version": V, "mcp-method": "server/discover" }, discover)).toEqual({ kind: "request", method: "server/discover", id: "d" })
  })

  it("refuses with the specification's codes and statuses", () => {
    const refusal = (h: Record<string, string>, body: Record<string, unknown>) => {
      const verdict = ModernRequest.check(h, body)
      return verdict.kind === "refused" ? [verdict.status, verdict.code, verdict.message] : [0, 0, verdict.kind]
    }
    const { "mcp-protocol-version": _, ...noVersion } = headers()
    expect(refusal(noVersion, call("a_b"))).toEqual([400, -32020, "Header mismatch: the MCP-Protocol-Version header is required"])
    expect(refusal(headers({ "mcp-protocol-version": "2026-01-01" }), call("a_b"))[1]).toBe(-32020)
    const unsupported = ModernRequest.check(headers({ "mcp-protocol-version": "2099-01-01" }), call("a_b", meta({ [Modern.Meta.protocolVersion]: "2099-01-01" })))
    expect(unsupported).toMatchObject({ kind: "refused", status: 400, code: -32022, data: { supported: ModernRequest.Supported, requested: "2099-01-01" } })
    expect(ModernRequest.Supported).toContain("2025-11-25")
    const { "mcp-method": __, ...noMethod } = headers()
    expect(refusal(noMethod, call("a_b"))).toEqual([400, -32020, "Header mismatch: the Mcp-Method header is required"])
    expect(refusal(headers({ "mcp-method": "tools/list" }), call("a_b"))[1]).toBe(-32020)
    const { "mcp-name": ___, ...noName } = headers()
    expect(refusal(noName, call("a_b"))[1]).toBe(-32020)
    expect(refusal(headers({ "mcp-name": "other" }), call("a_b"))).toEqual([400, -32020, "Header mismatch: Mcp-Name header value 'other' does not match body value 'a_b'"])
    expect(refusal(headers({ "mcp-name": "=?base64?!!!?=" }), call("a_b"))[1]).toBe(-32020)
    expect(refusal(headers({ "mcp-method": "resources/list" }), { jsonrpc: "2.0", id: 1, method: "resources/list", params: { _meta: meta() } })[0]).toBe(404)
    expect(refusal(headers({ "mcp-method": "resources/list" }), { jsonrpc: "2.0", id: 1, method: "resources/list", params: { _meta: meta() } })[1]).toBe(-32601)
    expect(refusal(headers(), call("a_b", { [Modern.Meta.protocolVersion]: V }))).toEqual([400, -32602, `Invalid params: params._meta must carry ${Modern.Meta.clientCapabilities} (an object; {} declares none)`])
    expect(refusal(headers(), { jsonrpc: "2.0", id: 1, result: {} })[1]).toBe(-32600)
  })

  it("tasks/get, tasks/update and tasks/cancel need Mcp-Name equal to params.taskId and a client that declared the tasks extension", () => {
    const declared = meta({ [Modern.Meta.clientCapabilities]: { extensions: { [Modern.TasksExtension]: {} } } })
    const task = (method: string, m: Record<string, unknown> = declared) => ({ jsonrpc: "2.0", id: 8, method, params: { taskId: "t-1", _meta: m } })
    const taskHeaders = (method: string, extra: Record<string, string> = {}) => ({ "mcp-protocol-version": V, "mcp-method": method, "mcp-name": "t-1", ...extra })
    for (const method of ["tasks/get", "tasks/update", "tasks/cancel"]) {
      expect(ModernRequest.check(taskHeaders(method), task(method))).toEqual({ kind: "request", method, id: 8 })
      expect(ModernRequest.check(taskHeaders(method, { "mcp-name": "t-2" }), task(method))).toMatchObject({ kind: "refused", status: 400, code: -32020 })
      const { "mcp-name": _, ...noName } = taskHeaders(method)
      expect(ModernRequest.check(noName, task(method))).toMatchObject({ kind: "refused", status: 400, code: -32020 })
      expect(ModernRequest.check(taskHeaders(method), task(method, meta()))).toMatchObject({
        kind: "refused",
        status: 400,
        code: -32021,
        data: { requiredCapabilities: { extensions: { [Modern.TasksExtension]: {} } } }
      })
    }
    expect(ModernRequest.check(taskHeaders("tasks/get"), task("tasks/get", meta({ [Modern.Meta.clientCapabilities]: { extensions: { [Modern.TasksExtension]: true } } })))).toMatchObject({ code: -32021 })
  })

  it("takes a notification without acting on it", () => {
    const cancelled = { jsonrpc: "2.0", method: "notifications/cancelled", params: { requestId: 1, _meta: meta() } }
    expect(ModernRequest.check({ "mcp-protocol-version": V, "mcp-method": "notifications/cancelled" }, cancelled)).toEqual({ kind: "notification" })
  })
})
