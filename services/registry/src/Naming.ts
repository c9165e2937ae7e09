/**
 * One user's aggregate: the tools of all their tabs and their cached tools, as one MCP tool list
 * with unique names (MCP-B spec sections 2-3). Pure: the same records give the same list on every
 * replica, so names are stable wherever a `/hub` session lives.
 *
 * A tab's tool is `website_tool_<domain>_tab<tabId>_<tool>`; a cached tool is also listed once per
 * domain as `website_tool_<domain>_<tool>`. Domains and tool names are sanitised to `[a-zA-Z0-9_]`.
 * Sanitising can merge names (`a.b` and `a-b`) and long names must be cut to MCP's 128 characters,
 * so a name that is too long or taken by another tool ends in a short hash of exactly what it
 * stands for; names that are fine as they are stay readable.
 *
 * A call of a listed name goes to a tab chosen by what the name stands for (`pickTab`, section 3).
 */
import type { Registry } from "@switchboard/protocol"
import { createHash } from "node:crypto"

export const MaxName = 128

export const sanitize = (s: string): string => s.replace(/[^a-zA-Z0-9_]/g, "_")

/** What a listed name stands for; a call is routed by this, never by parsing the name. */
export interface Target {
  readonly domain: string
  /** The page's own tool name. */
  readonly tool: string
  /** Absent for a cached tool's domain-level name. */
  readonly tabId?: number
}

export interface Listed {
  readonly name: string
  readonly target: Target
  readonly tool: Registry.Tool
}

export interface Aggregate {
  /** Sorted by name, as `tools/list` pages through them. */
  readonly tools: ReadonlyArray<Listed>
  readonly byName: ReadonlyMap<string, Listed>
}

const hashOf = (t: Target, length: number) =>
  createHash("sha256").update(JSON.stringify([t.domain, t.tabId ?? null, t.tool])).digest("hex").slice(0, length)

const baseName = (t: Target) =>
  t.tabId === undefined
    ? `website_tool_${sanitize(t.domain)}_${sanitize(t.tool)}`
    : `website_tool_${sanitize(t.domain)}_tab${t.tabId}_${sanitize(t.tool)}`

/** Level 0 is the readable name (hashed only when too long); each level adds 8 hex digits of hash. */
const nameAt = (t: Target, level: number): string => {
  const base = baseName(t)
  const digits = Math.max(level, base.length > MaxName ? 1 : 0) * 8
  if (digits === 0) return base
  const suffix = `_${hashOf(t, digits)}`
  return base.slice(0, MaxName - suffix.length) + suffix
}

/** Unique names for distinct targets: every target of a clashing group moves up a hash level. */
export const assignNames = (targets: ReadonlyArray<Target>): ReadonlyArray<string> => {
  const levels = targets.map(() => 0)
  for (;;) {
    const names = targets.map((t, i) => nameAt(t, levels[i]!))
    const seen = new Map<string, Array<number>>()
    names.forEach((n, i) => {
      const group = seen.get(n)
      if (group) group.push(i)
      else seen.set(n, [i])
    })
    let bumped = false
    for (const group of seen.values()) {
      if (group.length < 2) continue
      // 64 hex digits of SHA-256 cannot clash for distinct targets; the cap keeps the loop finite.
      for (const i of group) {
        if (levels[i]! < 8) {
          levels[i]!++
          bumped = true
        }
      }
    }
    if (!bumped) return names
  }
}

/** The tab the user last brought to the front, per domain. */
const activeTabs = (tabs: ReadonlyArray<Registry.TabRecord>) => {
  const active = new Map<string, Registry.TabRecord>()
  for (const tab of tabs) {
    if (tab.activatedAt === 0) continue
    const current = active.get(tab.domain)
    if (current === undefined || tab.activatedAt > current.activatedAt) active.set(tab.domain, tab)
  }
  return active
}

export const activeTab = (tabs: ReadonlyArray<Registry.TabRecord>, domain: string): Registry.TabRecord | undefined =>
  activeTabs(tabs).get(domain)

/**
 * The tab a call of `target` goes to, among its domain's tabs by id (MCP-B routing, spec section
 * 3): the tab in the name, the domain's active tab, the latest updated; each only if it has the tool.
 */
export const pickTab = (domainTabs: ReadonlyMap<number, Registry.TabRecord> | undefined, target: Target): Registry.TabRecord | undefined => {
  if (domainTabs === undefined) return undefined
  const has = (t: Registry.TabRecord) => t.tools.some((tool) => tool.name === target.tool)
  const named = target.tabId === undefined ? undefined : domainTabs.get(target.tabId)
  if (named !== undefined && has(named)) return named
  const all = [...domainTabs.values()]
  const active = activeTab(all, target.domain)
  if (active !== undefined && has(active)) return active
  let best: Registry.TabRecord | undefined
  for (const t of all) if (has(t) && (best === undefined || t.updatedAt > best.updatedAt)) best = t
  return best
}

const describe = (tool: Registry.Tool, where: string) => {
  const own = tool.description ?? tool.title ?? tool.name
  return `[${where}] ${own}`
}

export const aggregate = (tabs: ReadonlyArray<Registry.TabRecord>, cached: ReadonlyArray<Registry.CachedToolRecord>): Aggregate => {
  const active = activeTabs(tabs)
  const entries: Array<{ readonly target: Target; readonly tool: Registry.Tool }> = []
  for (const tab of tabs) {
    const isActive = active.get(tab.domain)?.tabId === tab.tabId
    const where = `${tab.domain} · tab ${tab.tabId}${isActive ? " • active" : ""}${tab.title === undefined ? "" : ` · ${tab.title}`}`
    for (const tool of tab.tools) {
      entries.push({ target: { domain: tab.domain, tool: tool.name, tabId: tab.tabId }, tool: { ...tool, description: describe(tool, where) } })
    }
  }
  for (const c of cached) {
    const front = active.get(c.domain)
    const where = `${c.domain} · cached: runs in ${front === undefined ? "a tab of the site, opened if none is" : `the active tab ${front.tabId}`}`
    entries.push({ target: { domain: c.domain, tool: c.tool.name }, tool: { ...c.tool, description: describe(c.tool, where) } })
  }
  const names = assignNames(entries.map((e) => e.target))
  const tools = entries
    .map((e, i): Listed => ({ name: names[i]!, target: e.target, tool: e.tool }))
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
  return { tools, byName: new Map(tools.map((t) => [t.name, t])) }
}

/** The `Tool` objects of `tools/list`. */
export const toMcp = (listed: Listed) => ({ ...listed.tool, name: listed.name })
