/**
 * What a tab hears, and what the log says, about tools that were not registered. A frame may list
 * thousands of bad tools; both stay a few kilobytes: a few reasons quoted, the rest counted by kind.
 */
import type { Registry } from "@switchboard/protocol"

/** Reasons quoted in the tab's answer; every reason is short (names are cut to 40 characters). */
export const QuotedInAnswer = 20
/** Reasons quoted in a log line. */
export const QuotedInLog = 5

export const byKind = (rejections: ReadonlyArray<Registry.ToolRejection>): Record<string, number> => {
  const counts: Record<string, number> = {}
  for (const r of rejections) counts[r.kind] = (counts[r.kind] ?? 0) + 1
  return counts
}

/** The `rejected` part of the answer to `browser/registerTools` (the whole list when it is short). */
export const forTab = (rejections: ReadonlyArray<Registry.ToolRejection>) => ({
  rejected: rejections.slice(0, QuotedInAnswer).map((r) => r.reason),
  ...(rejections.length === 0 ? {} : { rejectedCount: rejections.length, rejectedByKind: byKind(rejections) })
})

/** One bounded log line: the count, the kinds, the first few reasons. */
export const logLine = (rejections: ReadonlyArray<Registry.ToolRejection>): string => {
  const kinds = Object.entries(byKind(rejections)).map(([kind, n]) => `${kind}: ${n}`).join(", ")
  const first = rejections.slice(0, QuotedInLog).map((r) => r.reason).join("; ")
  const more = rejections.length > QuotedInLog ? `; and ${rejections.length - QuotedInLog} more` : ""
  return `rejected ${rejections.length} tool(s) (${kinds}): ${first}${more}`
}
