/**
 * The documentation as a user meets it. The README tour runs as written: its shell lines against
 * `npm start`'s process, and its Node snippets saved inside the clone, as the README says, and run
 * with node. And every link in README.md, CONTRIBUTING.md, CHANGELOG.md and docs/ either goes to a
 * public https address or to a file (and heading) in this repository.
 */
import { describe, expect, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import { execFile } from "node:child_process"
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { WebSocket } from "ws"
import * as Processes from "./support/Processes.ts"
import { namespace, SECRET } from "./support/Stack.ts"

const root = fileURLToPath(new URL("../../", import.meta.url))
const readme = readFileSync(path.join(root, "README.md"), "utf8")
/** npm start's default port, which the tour falls back to when `PORT` is unset. */
const TOUR_PORT = "8080"

interface Block {
  readonly lang: string
  readonly code: string
  /** The prose between the previous block and this one, where the README says how to run it. */
  readonly before: string
}

/** The fenced code blocks of a piece of Markdown, each with the prose that leads to it. */
const blocksOf = (markdown: string): ReadonlyArray<Block> => {
  const blocks: Array<Block> = []
  const fence = /^```(\w*)\n([\s\S]*?)^```$/gm
  let last = 0
  for (let m = fence.exec(markdown); m !== null; m = fence.exec(markdown)) {
    blocks.push({ lang: m[1] ?? "", code: m[2] ?? "", before: markdown.slice(last, m.index) })
    last = m.index + m[0].length
  }
  return blocks
}

/** A `## ` section of the README, up to the next one. */
const section = (markdown: string, heading: string): string => {
  const start = markdown.indexOf(`\n## ${heading}\n`)
  if (start < 0) throw new Error(`README.md has no section "## ${heading}"`)
  const end = markdown.indexOf("\n## ", start + 1)
  return markdown.slice(start, end < 0 ? undefined : end)
}

interface Ran {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/** Only what node, npm and bash need from this environment. */
const baseEnv = (): Record<string, string> =>
  Object.fromEntries(["PATH", "HOME", "TMPDIR", "LANG"].flatMap((k) => (process.env[k] === undefined ? [] : [[k, process.env[k]!]])))

const run = (command: string, args: ReadonlyArray<string>, options: { cwd: string; env: Record<string, string>; timeout: number }) =>
  Effect.async<Ran>((resume) => {
    execFile(command, [...args], { ...options, env: { ...baseEnv(), ...options.env } }, (error, stdout, stderr) =>
      resume(Effect.succeed({ code: error === null ? 0 : typeof error.code === "number" ? error.code : null, stdout, stderr })))
  })

/** A line of the tour's shell block, run by bash with `PORT` set as for an `npm start` on `port`: the tour follows it. */
const shell = (line: string, port: number, env: Record<string, string> = {}, epilogue = "") =>
  run("bash", ["-c", `${line}\n${epilogue}`], { cwd: root, env: { PORT: String(port), ...env }, timeout: 60_000 })

const lineOf = (code: string, start: string): string => {
  const line = code.split("\n").find((l) => l.startsWith(start))
  if (line === undefined) throw new Error(`the tour's shell block has no line starting with ${start}`)
  return line
}

/** How a WebSocket upgrade ends: opened (and its first frame), or the error `ws` (and so wscat) reports. */
const upgrade = (url: string) =>
  Effect.async<{ readonly first?: string; readonly error?: string }>((resume) => {
    const ws = new WebSocket(url)
    ws.once("message", (data: Buffer) => {
      resume(Effect.succeed({ first: data.toString() }))
      ws.close()
    })
    ws.once("error", (e) => resume(Effect.succeed({ error: e.message })))
  })

/** A folder inside the clone (`.tmp/` is ignored by git), removed with the scope. */
const scratch = Effect.acquireRelease(
  Effect.sync(() => {
    mkdirSync(path.join(root, ".tmp"), { recursive: true })
    return mkdtempSync(path.join(root, ".tmp", "docs-tour-"))
  }),
  (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
)

describe("README host snippets", () => {
  it("each `claude mcp add` names its own server, so both can be added", () => {
    const names = [...readme.matchAll(/^claude mcp add (.*)$/gm)].map((m) => {
      // The name is the first word that is neither an option nor an option's value.
      const words = (m[1] ?? "").split(" ")
      for (let i = 0; i < words.length; i++) {
        const w = words[i] ?? ""
        if (w === "--") break
        if (w.startsWith("-")) {
          if (!w.includes("=")) i++
          continue
        }
        return w
      }
      return ""
    })
    expect(names.length).toBeGreaterThanOrEqual(2)
    expect(names).not.toContain("")
    expect(new Set(names).size, names.join(", ")).toBe(names.length)
  })

  it("says the Inspector's CLI needs --transport http for /hub", () => {
    const inspector = section(readme, "Connecting MCP hosts (Streamable HTTP)").split(/^### MCP Inspector$/m)[1] ?? ""
    expect(inspector).toMatch(/npx @modelcontextprotocol\/inspector --cli http:\/\/127\.0\.0\.1:8080\/hub --transport http /)
  })
})

/**
 * Whether Node `version` satisfies an `engines.node` range of the shapes lockfiles hold (`>=22`,
 * `>= 22.x`, `^20.9.0`, `20`, joined by `||`). A shape it does not know counts as satisfied.
 */
const nodeSatisfies = (version: string, range: string): boolean => {
  const [major = 0, minor = 0, patch = 0] = version.replace(/^v/, "").split(".").map(Number)
  const at = (v: string) => v.replace(/\.x/g, "").split(".").map(Number)
  const compare = (v: ReadonlyArray<number>) => (major - (v[0] ?? 0)) || (minor - (v[1] ?? 0)) || (patch - (v[2] ?? 0))
  return range.split("||").some((alternative) => {
    const a = alternative.trim().replace(/\s+/g, "")
    let m: RegExpExecArray | null
    if ((m = /^>=([\d.x]+)$/.exec(a)) !== null) return compare(at(m[1] ?? "")) >= 0
    if ((m = /^\^([\d.x]+)$/.exec(a)) !== null) return major === at(m[1] ?? "")[0] && compare(at(m[1] ?? "")) >= 0
    if ((m = /^(\d+)(\.x)?$/.exec(a)) !== null) return major === Number(m[1])
    return true
  })
}

describe("README on npm install", () => {
  it("explains each EBADENGINE warning npm gives on this Node, naming the package", () => {
    const lock = JSON.parse(readFileSync(path.join(root, "package-lock.json"), "utf8")) as {
      packages: Record<string, { engines?: { node?: string }; optional?: boolean }>
    }
    const warned = Object.entries(lock.packages)
      // npm skips an optional package that does not fit (rollup's lzma binary), without a warning.
      .filter(([where, p]) => where !== "" && p.optional !== true && p.engines?.node !== undefined && !nodeSatisfies(process.version, p.engines.node))
      .map(([where]) => where.replace(/^.*node_modules\//, ""))
    const note = section(readme, "Two commands")
    for (const name of warned) expect(note, `npm install warns EBADENGINE for ${name}`).toContain(`\`${name}\``)
  })
})

describe("README tour", () => {
  const tour = section(readme, "A 60-second tour")
  const blocks = blocksOf(tour)
  const sh = blocks.filter((b) => b.lang === "sh")
  const js = blocks.filter((b) => b.lang === "js")

  it("has one shell block and two Node snippets, each saved as an .mjs file named in the prose", () => {
    expect(sh).toHaveLength(1)
    expect(js).toHaveLength(2)
    for (const b of js) expect(b.before).toMatch(/save as `[\w-]+\.mjs`/)
    // The snippets resolve `ws` and the SDK from the clone's node_modules, so the README must say where to save them.
    expect(tour).toMatch(/inside the clone/)
  })

  it.scopedLive(
    "runs as written against npm start's process: health, a token, MCPx upgrades, metrics, and both snippets",
    () =>
      Effect.gen(function*() {
        const server = yield* Processes.allInOne({ namespace: namespace() })
        const code = sh[0]!.code
        // No port written in: every line follows PORT, with npm start's default when it is unset.
        expect(code).not.toMatch(new RegExp(`:${TOUR_PORT}\\b`))
        for (const b of js) expect(b.code).not.toMatch(new RegExp(`:${TOUR_PORT}\\b`))

        // npm start & and the wait for it: the loop ends once the process answers.
        const healthy = yield* shell(lineOf(code, "until curl"), server.port)
        expect(healthy, healthy.stderr).toMatchObject({ code: 0, stdout: "ok\n" })

        // The README's own command mints the token every later step uses.
        const minted = yield* shell(lineOf(code, "TOKEN=$(npm run -s token"), server.port, { SWITCHBOARD_JWT_SECRET: SECRET }, `printf %s "$TOKEN"`)
        expect(minted.code, minted.stderr).toBe(0)
        const token = minted.stdout
        expect(token).toMatch(/^[\w-]+\.[\w-]+\.[\w-]+$/)
        const claims = JSON.parse(Buffer.from(token.split(".")[1]!, "base64url").toString()) as Record<string, unknown>
        expect(claims["sub"]).toBe("alice")

        // The wscat lines: npx needs -y to fetch wscat without asking. wscat is ws, so ws sees what it would.
        const wscat = code.split("\n").filter((l) => l.includes("wscat"))
        expect(wscat).toHaveLength(2)
        for (const l of wscat) expect(l).toMatch(/^npx -y wscat -c "ws:\/\/127\.0\.0\.1:\$\{PORT:-8080\}\/v0\/ws\?topic=lobby&token=/)
        const joined = yield* upgrade(`${server.ws}/v0/ws?topic=lobby&token=${token}`)
        expect(JSON.parse(joined.first ?? "{}")).toMatchObject({ from: "system:gateway", kind: "system", payload: { event: "welcome", participant: { id: "alice" } } })
        const refused = yield* upgrade(`${server.ws}/v0/ws?topic=lobby&token=bad`)
        expect(wscat[1]).toContain(`# error: ${refused.error}`)
        expect(refused.error).toBe("Unexpected server response: 401")

        const metrics = yield* shell(lineOf(code, "curl -s localhost:${PORT:-8080}/metrics"), server.port)
        expect(metrics, metrics.stderr).toMatchObject({ code: 0, stdout: expect.stringContaining("switchboard_edge_connections") })

        // The Node snippets, saved inside the clone under the names the README gives them.
        const dir = yield* scratch
        const outputs: Array<string> = []
        for (const b of js) {
          const name = /save as `([\w-]+\.mjs)`/.exec(b.before)![1]!
          const file = path.join(dir, name)
          writeFileSync(file, b.code)
          const ran = yield* run(process.execPath, [file], { cwd: dir, env: { TOKEN: token, PORT: String(server.port) }, timeout: 30_000 })
          expect(ran.code, `${name} failed:\n${ran.stderr}\n${ran.stdout}`).toBe(0)
          // What a `console.log(...)   // {…}` or `// […]` comment says is printed, is printed.
          for (const [, printed] of b.code.matchAll(/console\.log\(.*\)\s*\/\/ ([[{].*)$/gm)) expect(ran.stdout).toContain(printed)
          outputs.push(ran.stdout)
        }
        const [proxy = "", hub = ""] = outputs
        // The proxy snippet: handshake, connect, and createTab answered under the client's own id 3.
        expect(proxy).toMatch(/id: 1,\s+result: \{[^}]*authenticated: true/)
        expect(proxy).toMatch(/id: 2,\s+result: \{\s+connection_id: 'conn-/)
        expect(proxy).toMatch(/id: 3,\s+result: \{ tabId: 42, echo: \{ url: 'https:\/\/example\.com' \} \}/)
        // The registry snippet: the tool is registered, listed under its hub name, and called in the tab.
        expect(hub).toContain("[ 'website_tool_example_com_tab1_greet' ]")
        expect(hub).toMatch(/content: \[ \{ type: 'text', text: 'hello you' \} \]/)
      }),
    180_000
  )
})

// --- links -----------------------------------------------------------------------------------

const markdownFiles = (): ReadonlyArray<string> => {
  const found = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"].filter((f) => existsSync(path.join(root, f)))
  const walk = (dir: string): void => {
    for (const entry of readdirSync(path.join(root, dir), { withFileTypes: true })) {
      const rel = path.join(dir, entry.name)
      if (entry.isDirectory()) walk(rel)
      else if (entry.name.endsWith(".md")) found.push(rel)
    }
  }
  walk("docs")
  return found
}

/** Markdown without its fenced blocks, which hold shell comments (`# ok`) and code, not headings or links. */
const prose = (markdown: string) => markdown.replace(/^```[\s\S]*?^```$/gm, "")

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens; repeats get -1, -2. */
const anchorsOf = (markdown: string): ReadonlySet<string> => {
  const seen = new Map<string, number>()
  const anchors = new Set<string>()
  for (const [, heading] of prose(markdown).matchAll(/^#{1,6} +(.+?) *#*$/gm)) {
    const base = heading!.toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, "").replace(/\s/g, "-")
    const n = seen.get(base) ?? 0
    seen.set(base, n + 1)
    anchors.add(n === 0 ? base : `${base}-${n}`)
  }
  return anchors
}

/** `[text](target)` links outside code; inline code is blanked first, so `[x](y)` in backticks is no link. */
const linksOf = (markdown: string): ReadonlyArray<string> =>
  [...prose(markdown).replace(/`[^`\n]*`/g, "``").matchAll(/\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)].map((m) => m[1]!)

describe("documentation links", () => {
  const files = markdownFiles()

  it("covers the README and every page under docs/", () => {
    expect(files).toContain("README.md")
    expect(files).toEqual(expect.arrayContaining(["docs/architecture.md", "docs/endpoints.md", "docs/http-api.md", "docs/protocols/proxy.md"]))
  })

  it.each(files)("%s points only at public https addresses and at files and headings in the repository", (file) => {
    const text = readFileSync(path.join(root, file), "utf8")
    // The specs and design notes that once lived beside the clone are not there for a user who clones it.
    expect(text).not.toMatch(/\.\.\/shared\b|shared\/(DESIGN|specs)/)
    for (const link of linksOf(text)) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(link)) {
        expect(link, `${file}: ${link}`).toMatch(/^https:\/\/[^/]+\.[^/]+/)
        continue
      }
      const [target = "", anchor] = link.split("#")
      const resolved = target === "" ? path.join(root, file) : path.resolve(root, path.dirname(file), decodeURIComponent(target))
      const inside = path.relative(root, resolved)
      expect(inside.startsWith("..") || path.isAbsolute(inside), `${file}: ${link} leaves the repository`).toBe(false)
      expect(existsSync(resolved), `${file}: ${link} does not exist`).toBe(true)
      if (anchor !== undefined && resolved.endsWith(".md") && statSync(resolved).isFile()) {
        expect([...anchorsOf(readFileSync(resolved, "utf8"))], `${file}: ${link} names no heading`).toContain(anchor)
      }
    }
  })
})
