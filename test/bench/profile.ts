/**
 * `npx tsx test/bench/profile.ts <BENCH_PROFILE dir> [window label substring] [top]`: where each
 * server process spent its CPU, counted only over the bench's measured windows (startup, connects
 * and teardown left out), as JSON lines of % of the process's busy samples: the top functions by
 * self time (any code, GC and native included as V8 names them), then the top functions of the
 * repository's own code by total time (itself and what it calls), which is where changes go.
 * Given a BENCH_HEAP_PROFILE dir (heapSampling.ts), the same two lists for what each window's
 * process allocated, in % of its sampled bytes, each with its MB over the window.
 *
 * A position V8 reports is mapped back to the TypeScript through a source map: the bundle's own
 * (the bench runs bundles), or, for a process run under tsx, the one tsx cached for that file (the
 * newest compiled before the process was ready). `code` quotes the compiled code there, which is
 * exact even if the source has been edited since.
 */
import { readdirSync, readFileSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"

interface CallFrame {
  readonly functionName: string
  readonly url: string
  readonly lineNumber: number
  readonly columnNumber: number
}
interface ProfileNode {
  readonly id: number
  readonly callFrame: CallFrame
  readonly children?: ReadonlyArray<number>
}
interface CpuProfile {
  readonly nodes: ReadonlyArray<ProfileNode>
  readonly startTime: number
  readonly samples: ReadonlyArray<number>
  readonly timeDeltas: ReadonlyArray<number>
}
interface Window {
  readonly label: string
  readonly from: number
  readonly to: number
}
interface Compiled {
  readonly code: string
  readonly map: { readonly sources: ReadonlyArray<string>; readonly mappings: string }
}

const [dir, labelFilter = "", topArg = "12"] = process.argv.slice(2)
if (dir === undefined) {
  console.error("usage: npx tsx test/bench/profile.ts <BENCH_PROFILE dir> [window label substring] [top]")
  process.exit(2)
}
const top = Number(topArg)

const jsonLines = <A>(file: string): ReadonlyArray<A> => {
  try {
    return readFileSync(join(dir, file), "utf8").split("\n").filter((l) => l !== "").map((l) => JSON.parse(l) as A)
  } catch {
    return []
  }
}
const started = new Map(jsonLines<{ pid: number; name: string; readyAt?: number }>("processes.jsonl").map((p) => [p.pid, p]))
const windows = jsonLines<Window>("windows.jsonl").filter((w) => w.label.includes(labelFilter))

// --- positions in tsx's compiled code back to the TypeScript -------------------------------

/** tsx's cache: every compiled version of every file, by source path. */
const compiled = new Map<string, Array<{ readonly mtime: number; readonly file: string }>>()
const cacheDir = join(tmpdir(), `tsx-${process.getuid?.() ?? 0}`)
const cacheEntries = (() => {
  try {
    return readdirSync(cacheDir)
  } catch {
    return [] // No cache: positions stay as V8 reports them.
  }
})()
for (const entry of cacheEntries) {
  // Compiled files are `<n>-<sha1>`; the folder also holds tsx's IPC sockets.
  if (!/^\d+-[0-9a-f]{40}$/.test(entry)) continue
  const file = join(cacheDir, entry)
  const source = /"sources":\["([^"]+)"\]/.exec(readFileSync(file, "utf8"))?.[1]
  if (source === undefined) continue
  const versions = compiled.get(source) ?? []
  versions.push({ mtime: statSync(file).mtimeMs, file })
  compiled.set(source, versions)
}

const BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

/** One source-map segment as absolute [generated column, source index, source line, source column]. */
type Segment = readonly [number, number, number, number]

const decodeMappings = (mappings: string): ReadonlyArray<ReadonlyArray<Segment>> => {
  const lines: Array<Array<Segment>> = []
  const state = [0, 0, 0, 0, 0]
  for (const line of mappings.split(";")) {
    const segments: Array<Segment> = []
    state[0] = 0
    for (const segment of line.split(",")) {
      if (segment === "") continue
      const fields: Array<number> = []
      let value = 0
      let shift = 0
      for (const char of segment) {
        const digit = BASE64.indexOf(char)
        value += (digit & 31) << shift
        if (digit & 32) shift += 5
        else {
          fields.push(value & 1 ? -(value >>> 1) : value >>> 1)
          value = 0
          shift = 0
        }
      }
      fields.forEach((delta, i) => (state[i] = (state[i] ?? 0) + delta))
      if (fields.length >= 4) segments.push([state[0] ?? 0, state[1] ?? 0, state[2] ?? 0, state[3] ?? 0])
    }
    lines.push(segments)
  }
  return lines
}

interface Mapped {
  readonly code: ReadonlyArray<string>
  readonly sources: ReadonlyArray<string>
  readonly lines: ReadonlyArray<ReadonlyArray<Segment>>
}
const loaded = new Map<string, Mapped | undefined>()
const load = (file: string, read: () => Compiled) => {
  if (!loaded.has(file)) {
    const entry = read()
    loaded.set(file, { code: entry.code.split("\n"), sources: entry.map.sources, lines: decodeMappings(entry.map.mappings) })
  }
  return loaded.get(file)
}
/**
 * The compiled code a process ran at `path`, with its source map: a bundle (the bench runs
 * bundles; its map lies beside it), or the version tsx compiled of `path` last before the process
 * was ready (tests and `npm start` run under tsx).
 */
const compiledFor = (path: string, readyAt: number): Mapped | undefined => {
  if (path.endsWith(".js") && !path.includes("node_modules/")) {
    // Read once per bundle (a heap profile names it in thousands of nodes), and a bundle without a map once too.
    if (!loaded.has(path)) {
      try {
        const map = JSON.parse(readFileSync(`${path}.map`, "utf8")) as Compiled["map"]
        load(path, () => ({ code: readFileSync(path, "utf8"), map: { ...map, sources: map.sources.map((s) => join(dirname(path), s)) } }))
      } catch {
        loaded.set(path, undefined)
      }
    }
    return loaded.get(path)
  }
  const versions = (compiled.get(path) ?? []).filter((v) => v.mtime <= readyAt).sort((a, b) => b.mtime - a.mtime)
  const version = versions[0]
  return version === undefined ? undefined : load(version.file, () => JSON.parse(readFileSync(version.file, "utf8")) as Compiled)
}

/** `file:line` relative to the repository or node_modules, which is all a reader needs to find it. */
const shorten = (url: string) =>
  url.includes("node_modules/") ? url.slice(url.lastIndexOf("node_modules/") + 13) : url.replace(/^.*?\/(libs|services|test)\//, "$1/")

interface Place {
  /** The source file, or the file V8 reports when there is no map. */
  readonly source: string
  readonly at: string
  readonly code?: string
}
const places = new Map<CallFrame, Place>()
const place = (frame: CallFrame, readyAt: number): Place => {
  let found = places.get(frame)
  if (found !== undefined) return found
  const path = frame.url.replace(/^file:\/\//, "").replace(/\?.*$/, "")
  const version = path === "" ? undefined : compiledFor(path, readyAt)
  if (path === "") found = { source: "", at: "(native)" }
  else if (version === undefined) found = { source: path, at: `${shorten(path)}:${frame.lineNumber + 1}` }
  else {
    let segment: Segment | undefined
    for (const s of version.lines[frame.lineNumber] ?? []) if (s[0] <= frame.columnNumber) segment = s
    const source = segment === undefined ? path : (version.sources[segment[1]] ?? path)
    const code = (version.code[frame.lineNumber] ?? "").slice(frame.columnNumber, frame.columnNumber + 70)
    found = { source, at: `${shorten(source)}:${segment === undefined ? "?" : segment[2] + 1}`, code }
  }
  places.set(frame, found)
  return found
}

// --- counting ------------------------------------------------------------------------------

/** The repository's own code (a bundle holds its dependencies too, so the source decides). */
const ours = (source: string) => /\/(libs|services)\//.test(source) && !source.includes("node_modules/")
const add = (counts: Map<string, number>, key: string) => counts.set(key, (counts.get(key) ?? 0) + 1)
const pct = (n: number, of: number) => Math.round((n / Math.max(1, of)) * 1000) / 10

for (const file of readdirSync(dir).filter((f) => f.endsWith(".cpuprofile")).sort()) {
  const profile = JSON.parse(readFileSync(join(dir, file), "utf8")) as CpuProfile
  const pid = Number(/\.(\d+)\.\d+\.\d+\.cpuprofile$/.exec(file)?.[1] ?? 0)
  const readyAt = started.get(pid)?.readyAt ?? statSync(join(dir, file)).mtimeMs
  const byId = new Map(profile.nodes.map((n) => [n.id, n.callFrame]))
  const parent = new Map<number, number>()
  for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id)
  /** Functions by name and position, so that one closure's samples add up across its nodes. */
  const keyOf = (frame: CallFrame) => `${frame.functionName}\t${frame.url}\t${frame.lineNumber}\t${frame.columnNumber}`
  const frames = new Map<string, CallFrame>()
  const self = new Map<string, number>()
  const total = new Map<string, number>()
  let busy = 0
  let counted = 0
  let t = profile.startTime
  profile.samples.forEach((id, i) => {
    t += profile.timeDeltas[i] ?? 0
    if (windows.length > 0 && !windows.some((w) => t >= w.from && t <= w.to)) return
    counted++
    const frame = byId.get(id)
    if (frame === undefined || frame.functionName === "(idle)") return
    busy++
    frames.set(keyOf(frame), frame)
    add(self, keyOf(frame))
    // Each function once per sample, however deep it recurses.
    const onStack = new Set<string>()
    for (let node: number | undefined = id; node !== undefined; node = parent.get(node)) {
      const f = byId.get(node)
      if (f === undefined || !ours(place(f, readyAt).source)) continue
      frames.set(keyOf(f), f)
      onStack.add(keyOf(f))
    }
    for (const key of onStack) add(total, key)
  })
  if (busy === 0) continue
  const who = started.get(pid)?.name ?? `pid ${pid}`
  console.log(JSON.stringify({ process: who, samples_in_windows: counted, busy_pct: pct(busy, counted) }))
  const print = (kind: string, counts: Map<string, number>) => {
    for (const [key, n] of [...counts].sort((a, b) => b[1] - a[1]).slice(0, top)) {
      const frame = frames.get(key)
      if (frame === undefined) continue
      const { at, code } = place(frame, readyAt)
      console.log(JSON.stringify({ process: who, kind, pct: pct(n, busy), function: frame.functionName || "(anonymous)", at, ...(code === undefined ? {} : { code }) }))
    }
  }
  print("self", self)
  print("total", total)
}

// --- allocations (BENCH_HEAP_PROFILE) ------------------------------------------------------

interface HeapNode {
  readonly id: number
  readonly callFrame: CallFrame
  readonly selfSize: number
  readonly children: ReadonlyArray<HeapNode>
}

for (const file of readdirSync(dir).filter((f) => f.endsWith(".heapprofile") && f.includes(labelFilter.replace(/\W+/g, "_"))).sort()) {
  const head = (JSON.parse(readFileSync(join(dir, file), "utf8")) as { readonly head: HeapNode }).head
  const pid = Number(/\.(\d+)\./.exec(file)?.[1] ?? 0)
  const readyAt = started.get(pid)?.readyAt ?? statSync(join(dir, file)).mtimeMs
  const keyOf = (frame: CallFrame) => `${frame.functionName}\t${frame.url}\t${frame.lineNumber}\t${frame.columnNumber}`
  const frames = new Map<string, CallFrame>()
  const self = new Map<string, number>()
  const total = new Map<string, number>()
  const addBytes = (counts: Map<string, number>, key: string, n: number) => counts.set(key, (counts.get(key) ?? 0) + n)
  let bytes = 0
  /** Depth first, with the repository's own functions on the path (each once). */
  const visit = (node: HeapNode, ownPath: ReadonlyArray<string>) => {
    const key = keyOf(node.callFrame)
    frames.set(key, node.callFrame)
    const path = ours(place(node.callFrame, readyAt).source) && !ownPath.includes(key) ? [...ownPath, key] : ownPath
    if (node.selfSize > 0) {
      bytes += node.selfSize
      addBytes(self, key, node.selfSize)
      for (const k of path) addBytes(total, k, node.selfSize)
    }
    for (const child of node.children) visit(child, path)
  }
  visit(head, [])
  const who = `${started.get(pid)?.name ?? `pid ${pid}`} (${file})`
  console.log(JSON.stringify({ process: who, allocated_mb: Math.round(bytes / 1e5) / 10 }))
  const print = (kind: string, counts: Map<string, number>) => {
    for (const [key, n] of [...counts].sort((a, b) => b[1] - a[1]).slice(0, top)) {
      const frame = frames.get(key)
      if (frame === undefined) continue
      const { at, code } = place(frame, readyAt)
      console.log(JSON.stringify({ process: who, kind: `alloc_${kind}`, pct: pct(n, bytes), mb: Math.round(n / 1e5) / 10, function: frame.functionName || "(anonymous)", at, ...(code === undefined ? {} : { code }) }))
    }
  }
  print("self", self)
  print("total", total)
}
