/**
 * How a tool call ended, read from the tab's answer to `browser/executeTool` two ways side by
 * side: as the client's JSON-RPC answer (`answerOf`), and for `switchboard_tool_calls_total`
 * (`ofTabAnswer`), so that the counts match what clients saw.
 */
import { JsonRpc, Registry } from "@switchboard/protocol"
import type { Instruments } from "@switchboard/telemetry"
import { failure, result } from "@switchboard/protocol/JsonRpc"

const { ErrorCode, isRecord } = JsonRpc

/**
 * The client's answer to call `id`, from the tab's answer. `complete` adds what a successful
 * answer carries beside the tab's result (MCP 2026-07-28's `resultType`).
 */
export const answerOf = (id: JsonRpc.Id, m: Record<string, unknown>, complete: ((value: Record<string, unknown>) => Record<string, unknown>) | undefined): string => {
  if ("error" in m && isRecord(m["error"])) {
    const error = m["error"]
    // The tab's own fields, checked rather than converted: String() throws on {"toString": 1}.
    const given = error["code"]
    const code = typeof given === "number" && Number.isSafeInteger(given) ? given : ErrorCode.InternalError
    return failure(id, code, typeof error["message"] === "string" ? error["message"] : "the tab failed")
  }
  const answered = m["result"]
  if (!Registry.isExecuteResult(answered)) return failure(id, ErrorCode.InternalError, "Internal error: the tab answered browser/executeTool without {success, payload}")
  const { payload, success } = answered
  const text = typeof payload === "string" ? payload : JSON.stringify(payload)
  const value = !success
    ? { content: [{ type: "text", text }], isError: true }
    : isRecord(payload) && Array.isArray(payload["content"])
    ? payload
    : { content: [{ type: "text", text }] }
  return result(id, complete === undefined ? value : complete(value))
}

/**
 * A tab's answer to `browser/executeTool`: ok only for a well-formed `{success: true}` result
 * whose payload is not an MCP error result (`isError`, what a page's throwing tool answers).
 */
export const ofTabAnswer = (m: Record<string, unknown>): Instruments.ToolCallOutcome => {
  if ("error" in m) return "error"
  const answered = m["result"]
  if (!Registry.isExecuteResult(answered) || !answered.success) return "error"
  const { payload } = answered
  return isRecord(payload) && payload["isError"] === true ? "error" : "ok"
}

/** A call the registry ended itself: no tab has the tool (MCP-B's TabNotFound), or anything else. */
export const ofFailure = (code: number): Instruments.ToolCallOutcome => (code === Registry.TabNotFound ? "not_found" : "error")
