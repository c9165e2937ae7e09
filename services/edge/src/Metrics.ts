/** The edge's Prometheus metrics, kept as plain numbers on the hot path and rendered on scrape. */

const BUCKETS = [0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.005, 0.01, 0.05] as const

export class EdgeMetrics {
  readonly open = new Map<string, number>()
  readonly closes = new Map<number, number>()
  /** Streamable HTTP responses the edge cut because their client stopped reading, by why. */
  readonly httpCuts = new Map<"buffer" | "stall", number>()
  framesIn = 0
  framesOut = 0
  bytesIn = 0
  bytesOut = 0
  rateLimited = 0
  private readonly publishBuckets = new Array<number>(BUCKETS.length).fill(0)
  private publishCount = 0
  private publishSum = 0

  opened(path: string) {
    this.open.set(path, (this.open.get(path) ?? 0) + 1)
  }
  closed(path: string, code: number) {
    this.open.set(path, (this.open.get(path) ?? 1) - 1)
    this.closes.set(code, (this.closes.get(code) ?? 0) + 1)
  }
  httpCut(reason: "buffer" | "stall") {
    this.httpCuts.set(reason, (this.httpCuts.get(reason) ?? 0) + 1)
  }
  observePublish(seconds: number) {
    this.publishCount++
    this.publishSum += seconds
    for (let i = 0; i < BUCKETS.length; i++) if (seconds <= BUCKETS[i]!) this.publishBuckets[i]!++
  }

  render(): string {
    const lines: Array<string> = []
    const metric = (name: string, type: string, help: string) => lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`)
    metric("switchboard_edge_connections", "gauge", "Open WebSocket connections by path")
    for (const [path, n] of this.open) lines.push(`switchboard_edge_connections{path="${path}"} ${n}`)
    metric("switchboard_edge_frames_in_total", "counter", "Text frames received from clients")
    lines.push(`switchboard_edge_frames_in_total ${this.framesIn}`)
    metric("switchboard_edge_frames_out_total", "counter", "Text frames sent to clients")
    lines.push(`switchboard_edge_frames_out_total ${this.framesOut}`)
    metric("switchboard_edge_bytes_in_total", "counter", "Bytes received from clients")
    lines.push(`switchboard_edge_bytes_in_total ${this.bytesIn}`)
    metric("switchboard_edge_bytes_out_total", "counter", "Bytes sent to clients")
    lines.push(`switchboard_edge_bytes_out_total ${this.bytesOut}`)
    metric("switchboard_edge_rate_limited_total", "counter", "Frames over a connection's rate limit")
    lines.push(`switchboard_edge_rate_limited_total ${this.rateLimited}`)
    metric("switchboard_edge_closes_total", "counter", "Closed connections by close code")
    for (const [code, n] of this.closes) lines.push(`switchboard_edge_closes_total{code="${code}"} ${n}`)
    metric("switchboard_edge_http_responses_cut_total", "counter", "Streamable HTTP responses cut because their client stopped reading (buffer: over EDGE_OUTBOUND_HWM; stall: unmoved for EDGE_HTTP_WRITE_STALL)")
    for (const reason of ["buffer", "stall"] as const) lines.push(`switchboard_edge_http_responses_cut_total{reason="${reason}"} ${this.httpCuts.get(reason) ?? 0}`)
    metric("switchboard_edge_bus_publish_seconds", "histogram", "Time to hand a frame to the bus")
    BUCKETS.forEach((le, i) => lines.push(`switchboard_edge_bus_publish_seconds_bucket{le="${le}"} ${this.publishBuckets[i]}`))
    lines.push(`switchboard_edge_bus_publish_seconds_bucket{le="+Inf"} ${this.publishCount}`)
    lines.push(`switchboard_edge_bus_publish_seconds_sum ${this.publishSum}`)
    lines.push(`switchboard_edge_bus_publish_seconds_count ${this.publishCount}`)
    return `${lines.join("\n")}\n`
  }
}
