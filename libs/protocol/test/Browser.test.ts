// `@switchboard/protocol/browser/*` is what the extension and `/embed` bundle: these pin that it
// stays free of effect (a bundle would otherwise take the Schemas with it), that the text builders
// the services and the clients share write what the Schemas accept, and the shared Backoff's steps.
import { describe, expect, it } from "@effect/vitest"
import * as Either from "effect/Either"
import { build } from "esbuild"
import { readdirSync } from "node:fs"
import { fileURLToPath } from "node:url"
import { Backoff } from "../src/browser/Backoff.ts"
import * as JsonRpc from "../src/browser/JsonRpc.ts"
import * as Registry from "../src/browser/Registry.ts"
import { decodeFrame, type Incoming } from "../src/JsonRpc.ts"

const browserDir = fileURLToPath(new URL("../src/browser/", import.meta.url))

const tagOf = (text: string): Incoming["_tag"] | "invalid" => Either.match(decodeFrame(text), { onLeft: () => "invalid", onRight: (m) => m._tag })

describe("@switchboard/protocol/browser", () => {
  it("bundles for a browser from its own folder alone", async () => {
    const modules = readdirSync(browserDir).filter((f) => f.endsWith(".ts"))
    expect(modules).toContain("JsonRpc.ts")
    const out = await build({
      entryPoints: modules.map((f) => `${browserDir}${f}`),
      outdir: "unused", // write: false; esbuild wants an outdir for several entries
      bundle: true,
      platform: "browser",
      format: "iife",
      write: false,
      metafile: true,
      logLevel: "silent"
    })
    const outside = Object.keys(out.metafile.inputs).filter((input) => !fileURLToPath(new URL(input, `file://${process.cwd()}/`)).startsWith(browserDir))
    expect(outside).toEqual([])
  })

  describe("JSON-RPC builders", () => {
    it("write the wire text, jsonrpc first", () => {
      expect(JsonRpc.request(7, "connect", { extension_id: "e" })).toBe(`{"jsonrpc":"2.0","id":7,"method":"connect","params":{"extension_id":"e"}}`)
      expect(JsonRpc.notification("status", { connected: true })).toBe(`{"jsonrpc":"2.0","method":"status","params":{"connected":true}}`)
      expect(JsonRpc.notification("notifications/tools/list_changed")).toBe(`{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`)
      expect(JsonRpc.result("a", { ok: 1 })).toBe(`{"jsonrpc":"2.0","id":"a","result":{"ok":1}}`)
      expect(JsonRpc.failure(null, JsonRpc.ErrorCode.ParseError, "Parse error")).toBe(`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}`)
    })

    it("write what the Schemas decode as the message meant", () => {
      expect(tagOf(JsonRpc.request("x:1", "browser/executeTool", { toolName: "t", args: {} }))).toBe("Request")
      expect(tagOf(JsonRpc.notification("browser/activated", {}))).toBe("Notification")
      expect(tagOf(JsonRpc.notification("notifications/tools/list_changed"))).toBe("Notification")
      expect(tagOf(JsonRpc.result(1, null))).toBe("Response")
      expect(tagOf(JsonRpc.failure(1, JsonRpc.ErrorCode.ServerError1, "Extension disconnected"))).toBe("Response")
    })

    it("give an error object a data member only when there is data", () => {
      expect(JsonRpc.errorResponse(1, -32602, "bad")).toStrictEqual({ jsonrpc: "2.0", id: 1, error: { code: -32602, message: "bad" } })
      expect(JsonRpc.errorResponse(1, -32602, "bad", { at: "x" })).toStrictEqual({ jsonrpc: "2.0", id: 1, error: { code: -32602, message: "bad", data: { at: "x" } } })
    })

    it("tell ids and JSON objects from anything else", () => {
      expect([1, "a", Infinity, null, undefined, {}].map(JsonRpc.isId)).toEqual([true, true, false, false, false, false])
      expect([{}, [], null, "a"].map(JsonRpc.isRecord)).toEqual([true, false, false, false])
      expect([{ success: false, payload: "no" }, { payload: 1 }, { success: "yes" }, []].map(Registry.isExecuteResult)).toEqual([true, false, false, false])
    })
  })

  describe("Backoff", () => {
    it("takes its own steps: 500 ms doubling to 30 s, as the extension's sockets do", () => {
      const low = new Backoff({ initialMillis: 500, maxMillis: 30_000, random: () => 0 })
      expect(Array.from({ length: 9 }, () => low.next())).toEqual([250, 500, 1000, 2000, 4000, 8000, 15000, 15000, 15000])
      const high = new Backoff({ initialMillis: 500, maxMillis: 30_000, random: () => 1 })
      expect(Array.from({ length: 9 }, () => high.next())).toEqual([500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000])
    })

    it("stays at its longest step through a long outage, and starts over after a reset", () => {
      const b = new Backoff({ random: () => 1 })
      const delays = Array.from({ length: 2000 }, () => b.next())
      expect(delays.at(-1)).toBe(10_000)
      expect(delays.every(Number.isFinite)).toBe(true)
      b.reset()
      expect(b.next()).toBe(250)
    })
  })
})
