/**
 * Closed-loop load: `clients` sockets each keep `inFlight` frames outstanding and send one more per
 * reply. Replies come back in order, so each socket's send times form a FIFO and latency needs no
 * payload parsing. Bounded by time; the first `warmup` is not counted. Frames that are not replies
 * (a proxy's notifications) are told apart by `isReply` and neither counted nor answered.
 */
import { WebSocket } from "ws"

export interface Shape {
  readonly clients: number
  readonly inFlight: number
}

export interface Result {
  readonly msgsPerSec: number
  readonly p50Us: number
  readonly p99Us: number
  readonly count: number
}

export interface LoadOptions {
  readonly url: string
  readonly shape: Shape
  readonly seconds: number
  readonly warmupSeconds: number
  /** Makes frame n of a client; defaults to a small JSON-RPC request. */
  readonly frame?: (n: number) => string
  /** Frames to send first on every socket, answered before the measured loop starts (handshakes). */
  readonly setup?: (ws: WebSocket) => Promise<void>
  /** Whether a frame answers one of ours; defaults to every frame. */
  readonly isReply?: (data: Buffer) => boolean
  /**
   * Called as the measured window opens and closes, so that callers sample server CPU over exactly
   * the counted seconds rather than over connects, handshakes, warmup and drain as well.
   */
  readonly onWindow?: (edge: "open" | "close") => void
}

const defaultFrame = (n: number) => `{"jsonrpc":"2.0","id":${n},"method":"bench/echo","params":{"n":${n}}}`

/** A client socket, once open (no compression, as every target is measured). */
export const open = (url: string) =>
  new Promise<WebSocket>((resolve, reject) => {
    const ws = new WebSocket(url, { perMessageDeflate: false })
    ws.once("open", () => resolve(ws))
    ws.once("error", reject)
  })

export const percentile = (sorted: Float64Array, p: number) =>
  sorted.length === 0 ? 0 : sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!

export const run = async (options: LoadOptions): Promise<Result> => {
  const frame = options.frame ?? defaultFrame
  const isReply = options.isReply ?? (() => true)
  const sockets = await Promise.all(Array.from({ length: options.shape.clients }, () => open(options.url)))
  if (options.setup) await Promise.all(sockets.map(options.setup))
  const latencies: Array<number> = []
  let measuring = false
  let stopped = false
  let count = 0
  const done: Array<Promise<void>> = []
  for (const ws of sockets) {
    const sentAt: Array<number> = []
    let n = 0
    const send = () => {
      sentAt.push(performance.now())
      ws.send(frame(n++))
    }
    done.push(
      new Promise<void>((resolve) => {
        let outstanding = 0
        ws.on("message", (data: Buffer) => {
          if (!isReply(data)) return
          const t0 = sentAt.shift() ?? performance.now()
          outstanding--
          if (measuring) {
            latencies.push((performance.now() - t0) * 1000)
            count++
          }
          if (!stopped) {
            outstanding++
            send()
          } else if (outstanding === 0) resolve()
        })
        ws.on("close", () => resolve())
        for (let i = 0; i < options.shape.inFlight; i++) {
          outstanding++
          send()
        }
      })
    )
  }
  await new Promise((r) => setTimeout(r, options.warmupSeconds * 1000))
  options.onWindow?.("open")
  measuring = true
  const start = performance.now()
  await new Promise((r) => setTimeout(r, options.seconds * 1000))
  measuring = false
  const elapsed = (performance.now() - start) / 1000
  options.onWindow?.("close")
  stopped = true
  await Promise.race([Promise.all(done), new Promise((r) => setTimeout(r, 5000))])
  for (const ws of sockets) ws.terminate()
  const sorted = Float64Array.from(latencies).sort()
  return {
    msgsPerSec: Math.round(count / elapsed),
    p50Us: Math.round(percentile(sorted, 50)),
    p99Us: Math.round(percentile(sorted, 99)),
    count
  }
}
