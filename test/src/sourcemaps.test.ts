/**
 * The bundles' source maps keep the project's own mappings and drop those of node_modules
 * (deploy/sourceMaps.mjs). Read by Node's own `SourceMap`, as --enable-source-maps reads them:
 * every place in a small bundle of one module of ours and one dependency maps where it mapped
 * before when it is ours, and to no source when it is the dependency's. A process started on the
 * bundle prints its own frames at their .ts lines, and the dependency's at the bundle's.
 */
import { describe, expect, it } from "@effect/vitest"
import { build } from "esbuild"
import { execFileSync } from "node:child_process"
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { SourceMap, type SourceMapPayload } from "node:module"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { keepMappings, ownSource } from "../../deploy/sourceMaps.mjs"

const dependency = `export const parse = (text) => {
  const value = JSON.parse(text)
  if (typeof value !== "object") throw new Error("not an object")
  return value
}
`
const own = `import { parse } from "dep"

interface Greeting { readonly to: string }

export const greet = (text: string): string => {
  const greeting = parse(text) as Greeting
  if (greeting.to === "nobody") throw new Error("greeted nobody")
  return \`hello \${greeting.to}\`
}

const which = process.argv[2] ?? ""
console.log(greet(which === "own" ? '{"to":"nobody"}' : which === "dependency" ? "1" : '{"to":"you"}'))
`

const bundled = () => {
  const dir = mkdtempSync(join(tmpdir(), "sb-sourcemaps-"))
  mkdirSync(join(dir, "node_modules", "dep"), { recursive: true })
  writeFileSync(join(dir, "node_modules", "dep", "package.json"), JSON.stringify({ name: "dep", type: "module", main: "index.js" }))
  writeFileSync(join(dir, "node_modules", "dep", "index.js"), dependency)
  mkdirSync(join(dir, "src"))
  writeFileSync(join(dir, "src", "main.ts"), own)
  return { dir, outfile: join(dir, "dist", "main.js") }
}

describe("bundle source maps", () => {
  it("keep every mapping of the project's code as it was, and map none of a dependency's", async () => {
    const { dir, outfile } = bundled()
    try {
      await build({ entryPoints: [join(dir, "src", "main.ts")], outfile, bundle: true, platform: "node", format: "esm", sourcemap: true, logLevel: "silent" })
      const before = JSON.parse(readFileSync(`${outfile}.map`, "utf8")) as SourceMapPayload
      const after = keepMappings(before, ownSource)
      expect(before.sources.some((s) => s.includes("node_modules/dep"))).toBe(true)
      expect(after.sourcesContent).toEqual(before.sourcesContent?.map((content, i) => (ownSource(before.sources[i]!) ? content : null)))

      const original = new SourceMap(before)
      const trimmed = new SourceMap(after)
      const lines = readFileSync(outfile, "utf8").split("\n")
      let ours = 0
      let theirs = 0
      lines.forEach((text, line) => {
        for (let column = 0; column <= text.length; column++) {
          const was = original.findEntry(line, column)
          const is = trimmed.findEntry(line, column)
          const source = "originalSource" in was ? was.originalSource : undefined
          if (source === undefined || !ownSource(source)) {
            if (source !== undefined) theirs++
            expect("originalSource" in is ? is.originalSource : undefined).toBeUndefined()
          } else {
            ours++
            expect(is).toEqual(was)
          }
        }
      })
      expect(ours).toBeGreaterThan(100)
      expect(theirs).toBeGreaterThan(50)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })

  it("print a process's own frames at their .ts lines and a dependency's at the bundle's", async () => {
    const { dir, outfile } = bundled()
    try {
      await build({ entryPoints: [join(dir, "src", "main.ts")], outfile, bundle: true, platform: "node", format: "esm", sourcemap: true, logLevel: "silent" })
      writeFileSync(`${outfile}.map`, JSON.stringify(keepMappings(JSON.parse(readFileSync(`${outfile}.map`, "utf8")), ownSource)))
      const run = (which: string) => {
        try {
          return execFileSync(process.execPath, ["--enable-source-maps", outfile, which], { encoding: "utf8", stdio: "pipe" })
        } catch (e) {
          return String((e as { stderr: string }).stderr)
        }
      }
      expect(run("")).toBe("hello you\n")
      const ownError = run("own")
      expect(ownError).toContain("greeted nobody")
      expect(ownError).toMatch(/src\/main\.ts:7:\d+/)
      const dependencyError = run("dependency")
      expect(dependencyError).toContain("not an object")
      expect(dependencyError).toMatch(/dist\/main\.js:\d+:\d+/)
      expect(dependencyError).not.toContain("node_modules/dep")
      expect(dependencyError).toMatch(/src\/main\.ts:6:\d+/)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
