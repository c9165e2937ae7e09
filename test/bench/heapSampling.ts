/**
 * With BENCH_HEAP_PROFILE=<dir>, every server process runs with its inspector open on a loopback
 * port, and V8's sampling heap profiler runs in it over each measured window whose label holds
 * BENCH_HEAP_WINDOW (all by default): what the process allocates while it serves the load, garbage
 * included (the profiler's own default keeps only what is still alive when it stops, which for
 * per-message work is nothing). `profile.ts <dir>` sums the samples by site.
 */
import { writeFileSync } from "node:fs"
import * as Net from "node:net"
import { WebSocket } from "ws"

export const HEAP_PROFILE = process.env["BENCH_HEAP_PROFILE"]
const WINDOW = process.env["BENCH_HEAP_WINDOW"] ?? ""
/** Bytes between samples: V8's default is 32 KiB, too coarse for a few hundred bytes a message. */
const INTERVAL = Number(process.env["BENCH_HEAP_INTERVAL"] ?? 4096)

/** A free loopback port for a child's inspector (closed again at once; the child opens it). */
export const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const server = Net.createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as Net.AddressInfo
      server.close(() => resolve(port))
    })
  })

interface Inspected {
  readonly name: string
  readonly pid: number
  readonly call: (method: string, params?: Record<string, unknown>) => Promise<unknown>
}
const inspected: Array<Inspected> = []

/** Connects to the inspector a child opened on `port`, so that windows can sample it. */
export const inspect = async (name: string, pid: number, port: number): Promise<void> => {
  const targets = (await (await fetch(`http://127.0.0.1:${port}/json/list`)).json()) as ReadonlyArray<{ readonly webSocketDebuggerUrl: string }>
  const url = targets[0]?.webSocketDebuggerUrl
  if (url === undefined) throw new Error(`${name} (${pid}) has no inspector target on port ${port}`)
  const ws = new WebSocket(url, { perMessageDeflate: false, maxPayload: 1024 * 1024 * 1024 })
  await new Promise((resolve, reject) => {
    ws.once("open", resolve)
    ws.once("error", reject)
  })
  let next = 0
  const waiting = new Map<number, { readonly resolve: (v: unknown) => void; readonly reject: (e: Error) => void }>()
  ws.on("message", (data: Buffer) => {
    const m = JSON.parse(data.toString()) as { id?: number; result?: unknown; error?: { message: string } }
    const w = m.id === undefined ? undefined : waiting.get(m.id)
    if (w === undefined || m.id === undefined) return
    waiting.delete(m.id)
    if (m.error !== undefined) w.reject(new Error(m.error.message))
    else w.resolve(m.result)
  })
  const call = (method: string, params: Record<string, unknown> = {}) =>
    new Promise<unknown>((resolve, reject) => {
      const id = ++next
      waiting.set(id, { resolve, reject })
      ws.send(JSON.stringify({ id, method, params }))
    })
  inspected.push({ name, pid, call })
}

/** Starts sampling in every inspected process; the returned function stops it and writes `<name>.<pid>.<label>.heapprofile`. */
export const heapWindow = (label: string): ((label: string) => void) => {
  if (HEAP_PROFILE === undefined || !label.includes(WINDOW)) return () => {}
  const sampled = [...inspected]
  const started = sampled.map((p) =>
    p.call("HeapProfiler.startSampling", {
      samplingInterval: INTERVAL,
      includeObjectsCollectedByMajorGC: true,
      includeObjectsCollectedByMinorGC: true
    })
  )
  return (closing) => {
    sampled.forEach((p, i) => {
      void Promise.resolve(started[i])
        .then(() => p.call("HeapProfiler.stopSampling"))
        .then((result) => {
          const profile = (result as { readonly profile: unknown }).profile
          writeFileSync(`${HEAP_PROFILE}/${p.name.replace(/\W+/g, "_")}.${p.pid}.${closing.replace(/\W+/g, "_")}.heapprofile`, JSON.stringify(profile))
        })
        .catch((e: unknown) => console.error(`heap sampling of ${p.name} failed: ${String(e)}`))
    })
  }
}
