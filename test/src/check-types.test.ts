/**
 * `npm run check-types` checks every workspace as one program (tsconfig.check.json) and the
 * extension as its own, instead of a program per workspace. These tests hold it to what the
 * per-workspace programs checked: every file a workspace's own tsconfig.json names is named by one
 * of the two programs, under the same compiler options, and the command runs both.
 */
import { describe, expect, it } from "@effect/vitest"
import { existsSync, readdirSync, readFileSync } from "node:fs"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import ts from "typescript"

const root = fileURLToPath(new URL("../../", import.meta.url))

/** The files a tsconfig names (its root files, before imports are followed) and its options. */
const parsed = (configPath: string) => {
  const { config, error } = ts.readConfigFile(configPath, ts.sys.readFile)
  if (error !== undefined) throw new Error(`${configPath}: ${ts.flattenDiagnosticMessageText(error.messageText, "\n")}`)
  const result = ts.parseJsonConfigFileContent(config, ts.sys, path.dirname(configPath), undefined, configPath)
  if (result.errors.length > 0) throw new Error(`${configPath}: ${result.errors.map((e) => ts.flattenDiagnosticMessageText(e.messageText, "\n")).join("; ")}`)
  return { files: new Set(result.fileNames.map((f) => path.resolve(f))), options: result.options }
}

/** Every workspace directory the root package.json's `workspaces` globs name. */
const workspaces = (): ReadonlyArray<string> => {
  const globs = (JSON.parse(readFileSync(path.join(root, "package.json"), "utf8")) as { workspaces: ReadonlyArray<string> }).workspaces
  return globs.flatMap((glob) => {
    if (!glob.endsWith("/*")) return [path.join(root, glob)]
    const parent = path.join(root, glob.slice(0, -2))
    return readdirSync(parent, { withFileTypes: true }).filter((d) => d.isDirectory() && existsSync(path.join(parent, d.name, "package.json"))).map((d) => path.join(parent, d.name))
  })
}

/** The options that decide what a program accepts; paths and file lists aside. */
const strictness = (options: ts.CompilerOptions) => {
  const { configFilePath: _path, pathsBasePath: _base, ...rest } = options
  return rest
}

describe("npm run check-types", () => {
  // Read in each test, so that each fails on its own when the file is missing.
  const wholeProgram = () => parsed(path.join(root, "tsconfig.check.json"))
  const extensionProgram = () => parsed(path.join(root, "clients/extension/tsconfig.json"))
  const isExtension = (dir: string) => path.relative(root, dir) === path.join("clients", "extension")

  it("names every file each workspace's own tsconfig.json names", () => {
    const [whole, extension] = [wholeProgram(), extensionProgram()]
    const left = workspaces().flatMap((dir) => {
      const own = parsed(path.join(dir, "tsconfig.json"))
      const program = isExtension(dir) ? extension : whole
      return [...own.files].filter((f) => !program.files.has(f)).map((f) => path.relative(root, f))
    })
    expect(workspaces().length).toBeGreaterThan(10)
    expect(left).toEqual([])
  })

  it("checks each workspace under its own compiler options", () => {
    const [whole, extension] = [wholeProgram(), extensionProgram()]
    const differing = workspaces().flatMap((dir) => {
      const own = parsed(path.join(dir, "tsconfig.json"))
      const program = isExtension(dir) ? extension : whole
      return JSON.stringify(strictness(own.options)) === JSON.stringify(strictness(program.options)) ? [] : [path.relative(root, dir)]
    })
    expect(differing).toEqual([])
  })

  it("leaves the extension's files, with chrome's types, out of the whole program", () => {
    const [whole, extension] = [wholeProgram(), extensionProgram()]
    expect([...whole.files].filter((f) => f.startsWith(path.join(root, "clients/extension/src")))).toEqual([])
    expect(extension.options.types).toContain("chrome")
    expect(whole.options.types).not.toContain("chrome")
  })

  it("runs both programs, and no workspace runs one of its own beside them", () => {
    const scripts = (dir: string) => (JSON.parse(readFileSync(path.join(dir, "package.json"), "utf8")) as { scripts?: Record<string, string> }).scripts ?? {}
    const command = scripts(root)["check-types"] ?? ""
    expect(command).toContain("tsc --noEmit -p tsconfig.check.json")
    expect(command).toContain("tsc --noEmit -p clients/extension")
    expect(workspaces().filter((dir) => scripts(dir)["check-types"] !== undefined).map((dir) => path.relative(root, dir))).toEqual([])
  })
})
