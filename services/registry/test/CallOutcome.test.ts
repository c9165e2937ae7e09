/**
 * A tab's answer to `browser/executeTool`, read as the client's answer (`answerOf`) and as the
 * counter's outcome (`ofTabAnswer`): the two agree, and nothing a tab sends makes either throw.
 */
import { describe, expect, it } from "@effect/vitest"
import { answerOf, ofTabAnswer } from "../src/CallOutcome.ts"

const read = (m: Record<string, unknown>, complete?: (value: Record<string, unknown>) => Record<string, unknown>) => ({
  client: JSON.parse(answerOf("c1", m, complete)) as unknown,
  outcome: ofTabAnswer(m)
})

describe("a tab's answer", () => {
  it("a text payload becomes text content; an MCP result passes as it is; a failure is an error result", () => {
    expect(read({ result: { success: true, payload: "done" } })).toEqual({
      client: { jsonrpc: "2.0", id: "c1", result: { content: [{ type: "text", text: "done" }] } },
      outcome: "ok"
    })
    const mcp = { content: [{ type: "text", text: "as is" }], structuredContent: { n: 1 } }
    expect(read({ result: { success: true, payload: mcp } }).client).toEqual({ jsonrpc: "2.0", id: "c1", result: mcp })
    expect(read({ result: { success: false, payload: { why: "no stock" } } })).toEqual({
      client: { jsonrpc: "2.0", id: "c1", result: { content: [{ type: "text", text: "{\"why\":\"no stock\"}" }], isError: true } },
      outcome: "error"
    })
  })

  it("a successful answer is completed as the era asks (resultType); an error is not", () => {
    const complete = (value: Record<string, unknown>) => ({ ...value, resultType: "complete" })
    expect(read({ result: { success: true, payload: "done" } }, complete).client).toEqual({
      jsonrpc: "2.0",
      id: "c1",
      result: { content: [{ type: "text", text: "done" }], resultType: "complete" }
    })
    expect(read({ error: { code: -32000, message: "page threw" } }, complete).client).toEqual({ jsonrpc: "2.0", id: "c1", error: { code: -32000, message: "page threw" } })
  })

  it("a tab's error keeps its code and message when they are sound; odd fields or a result without {success, payload} are an internal error", () => {
    expect(read({ error: { code: { toString: 1 }, message: 7 } })).toEqual({
      client: { jsonrpc: "2.0", id: "c1", error: { code: -32603, message: "the tab failed" } },
      outcome: "error"
    })
    expect(read({ result: { ok: true } })).toEqual({
      client: { jsonrpc: "2.0", id: "c1", error: { code: -32603, message: "Internal error: the tab answered browser/executeTool without {success, payload}" } },
      outcome: "error"
    })
  })
})
