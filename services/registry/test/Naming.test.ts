/** Tool names: readable where possible, within 128 characters always, and never the same for two tools. */
import { describe, expect, it } from "@effect/vitest"
import type { Registry } from "@switchboard/protocol"
import { aggregate, assignNames, MaxName, pickTab, sanitize, type Target } from "../src/Naming.ts"

const tab = (domain: string, tabId: number, tools: ReadonlyArray<string>, extra: Partial<Registry.TabRecord> = {}): Registry.TabRecord => ({
  user: "u",
  domain,
  tabId,
  url: `https://${domain}/`,
  conn: `c${tabId}`,
  edge: "e",
  activatedAt: 0,
  updatedAt: 0,
  tools: tools.map((name) => ({ name, inputSchema: { type: "object" } })),
  ...extra
})

describe("tool names", () => {
  it("sanitises domains and tools to [a-zA-Z0-9_]", () => {
    expect(sanitize("localhost:3000")).toBe("localhost_3000")
    expect(assignNames([{ domain: "localhost:3000", tabId: 7, tool: "get-cart" }])).toEqual(["website_tool_localhost_3000_tab7_get_cart"])
    expect(assignNames([{ domain: "docs.example.org", tool: "search" }])).toEqual(["website_tool_docs_example_org_search"])
  })

  it("keeps every name within 128 characters, and long ones apart", () => {
    const long = "a".repeat(120)
    const targets: Array<Target> = [
      { domain: `${"x".repeat(60)}.example.com`, tabId: 123456, tool: long },
      { domain: `${"x".repeat(60)}.example.com`, tabId: 123456, tool: `${long}b` },
      { domain: `${"x".repeat(60)}.example.com`, tool: long }
    ]
    const names = assignNames(targets)
    for (const n of names) expect(n.length).toBeLessThanOrEqual(MaxName)
    expect(new Set(names).size).toBe(3)
    // Stable: the same targets give the same names, in any order.
    expect(assignNames([...targets].reverse())).toEqual([...names].reverse())
  })

  it("never gives two tools one name, even when sanitising merges them", () => {
    const targets: Array<Target> = [
      { domain: "a.b", tabId: 1, tool: "t" },
      { domain: "a-b", tabId: 1, tool: "t" },
      { domain: "a_b", tabId: 1, tool: "t" },
      { domain: "c.d", tabId: 1, tool: "x.y" },
      { domain: "c.d", tabId: 1, tool: "x-y" },
      { domain: "e.f", tabId: 2, tool: "ok" }
    ]
    const names = assignNames(targets)
    expect(new Set(names).size).toBe(targets.length)
    for (const n of names) expect(n).toMatch(/^[a-zA-Z0-9_]{1,128}$/)
    // Names that clash carry a hash; the rest stay readable.
    expect(names[5]).toBe("website_tool_e_f_tab2_ok")
    expect(names[0]).toMatch(/^website_tool_a_b_tab1_t_[0-9a-f]{8}$/)
  })

  it("hundreds of overlapping tools all get distinct names", () => {
    const random: Array<Target> = Array.from({ length: 2_000 }, (_, i) => ({ domain: `d${i % 7}.com`, tabId: i % 5, tool: `t${i % 13}-${i % 3}` }))
    const unique = [...new Map(random.map((t) => [JSON.stringify(t), t])).values()]
    const names = assignNames(unique)
    expect(new Set(names).size).toBe(unique.length)
  })
})

describe("aggregate", () => {
  it("lists tab tools per tab and cached tools once per domain, marking the active tab", () => {
    const { byName, tools } = aggregate(
      [tab("shop.com", 1, ["cart"], { activatedAt: 5 }), tab("shop.com", 2, ["cart"], { activatedAt: 9 })],
      [{ domain: "shop.com", url: "https://shop.com/", tool: { name: "cart", inputSchema: { type: "object" } }, cachedAt: 1 }]
    )
    expect(tools.map((t) => t.name)).toEqual(["website_tool_shop_com_cart", "website_tool_shop_com_tab1_cart", "website_tool_shop_com_tab2_cart"])
    expect(byName.get("website_tool_shop_com_tab2_cart")?.tool.description).toContain("• active")
    expect(byName.get("website_tool_shop_com_tab1_cart")?.tool.description).not.toContain("• active")
    expect(byName.get("website_tool_shop_com_cart")?.target).toEqual({ domain: "shop.com", tool: "cart" })
    expect(byName.get("website_tool_shop_com_cart")?.tool.description).toContain("active tab 2")
  })
})

describe("the tab a call goes to", () => {
  const byId = (...tabs: ReadonlyArray<Registry.TabRecord>) => new Map(tabs.map((t) => [t.tabId, t] as const))
  const target = (tabId?: number): Target => ({ domain: "shop.example.com", tool: "buy", ...(tabId === undefined ? {} : { tabId }) })

  it("is the tab in the name when it has the tool, else the domain's active tab, else the latest updated", () => {
    const named = tab("shop.example.com", 1, ["buy"], { updatedAt: 1 })
    const active = tab("shop.example.com", 2, ["buy"], { activatedAt: 5, updatedAt: 2 })
    const latest = tab("shop.example.com", 3, ["buy"], { updatedAt: 9 })
    expect(pickTab(byId(named, active, latest), target(1))).toBe(named)
    expect(pickTab(byId(named, active, latest), target())).toBe(active)
    expect(pickTab(byId(named, latest), target())).toBe(latest)
  })

  it("passes over tabs without the tool, even the named and the active one; none has it, or no tab, is none", () => {
    const named = tab("shop.example.com", 1, ["browse"], { updatedAt: 9 })
    const active = tab("shop.example.com", 2, ["browse"], { activatedAt: 5 })
    const other = tab("shop.example.com", 3, ["buy"], { updatedAt: 1 })
    expect(pickTab(byId(named, active, other), target(1))).toBe(other)
    expect(pickTab(byId(named, active), target(1))).toBeUndefined()
    expect(pickTab(undefined, target())).toBeUndefined()
  })
})
