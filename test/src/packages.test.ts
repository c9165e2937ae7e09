/**
 * A production install (`npm ci --omit=dev`, what the image's build and a deployment run) carries
 * only what runs: the packages only tests use stay dev dependencies of the workspaces that use them.
 */
import { describe, expect, it } from "@effect/vitest"
import { execFile } from "node:child_process"
import { fileURLToPath } from "node:url"
import { promisify } from "node:util"

const root = fileURLToPath(new URL("../../", import.meta.url))

interface Tree {
  readonly dependencies?: Readonly<Record<string, Tree>>
}

/** Every package name in the tree npm would install without dev dependencies. */
const productionPackages = async () => {
  const { stdout } = await promisify(execFile)("npm", ["ls", "--omit=dev", "--all", "--json"], { cwd: root, maxBuffer: 64 * 1024 * 1024 })
  const names = new Set<string>()
  const walk = (tree: Tree) => {
    for (const [name, sub] of Object.entries(tree.dependencies ?? {})) {
      names.add(name)
      walk(sub)
    }
  }
  walk(JSON.parse(stdout) as Tree)
  return names
}

describe("install footprint", () => {
  it("leaves the test-only packages out of a production install", async () => {
    const names = await productionPackages()
    expect(names.has("effect")).toBe(true)
    expect(names.has("@nats-io/transport-node")).toBe(true)
    const testOnly = [...names].filter((n) => /^(playwright|playwright-core|testcontainers|@testcontainers\/.*|ssh2|docker-.*|vitest|@vitest\/.*|@effect\/vitest|@mcp-b\/.*)$/.test(n))
    expect(testOnly).toEqual([])
  }, 30_000)
})
