/**
 * How a tool call ended, for `switchboard_tool_calls_total`: the tab's answer read the way the
 * registry's `answerOf` turns it into the client's result, so the counts match what clients saw.
 */
import { JsonRpc, Registry } from "@switchboard/protocol"
import type { Instruments } from "@switchboard/telemetry"

/**
 * A tab's answer to `browser/executeTool`: ok only for a well-formed `{success: true}` result
 * whose payload is not an MCP error result (`isError`, what a page's throwing tool answers).
 */
export const ofTabAnswer = (m: Record<string, unknown>): Instruments.ToolCallOutcome => {
  if ("error" in m) return "error"
  const answered = m["result"]
  if (!Registry.isExecuteResult(answered) || !answered.success) return "error"
  const { payload } = answered
  return JsonRpc.isRecord(payload) && payload["isError"] === true ? "error" : "ok"
}

/** A call the registry ended itself: no tab has the tool (MCP-B's TabNotFound), or anything else. */
export const ofFailure = (code: number): Instruments.ToolCallOutcome => (code === Registry.TabNotFound ? "not_found" : "error")
