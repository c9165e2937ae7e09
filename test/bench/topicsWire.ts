/**
 * What topics.ts and its load processes (topicsWorker.ts) say to each other over the IPC channel,
 * and the latency histogram they merge: each process times its own topics, and a histogram of a
 * few hundred buckets crosses the channel where millions of samples would not.
 */

export type TopicsCommand =
  | {
    readonly type: "join"
    /** Edge base URLs (`ws://host:port`). */
    readonly urls: ReadonlyArray<string>
    readonly topicPrefix: string
    /** This process's block of topics: `firstTopic` and the `topics` after it. */
    readonly firstTopic: number
    readonly topics: number
    readonly size: number
    /** Handshakes in flight at once. */
    readonly inFlight: number
    /** How many of the block's topics are joined once this answers; later joins go on from there. */
    readonly upTo: number
  }
  | {
    readonly type: "chat"
    /** This process's share of the offered chats/s. */
    readonly rate: number
    readonly seconds: number
    readonly drainSeconds: number
  }
  | { readonly type: "close" }

export type TopicsReply =
  | { readonly type: "ready" }
  | {
    readonly type: "joined"
    readonly seconds: number
    /** Joins tried again so far, after the edge closed them with 1013 before the welcome. */
    readonly retries: number
  }
  | {
    readonly type: "chatted"
    readonly seconds: number
    readonly sent: number
    /** Deliveries while the chats were sent. */
    readonly delivered: number
    readonly undelivered: number
    readonly refused: number
    readonly closed: number
    /** Latencies of every delivery of the step's chats, the undelivered as infinitely late (Histogram.buckets). */
    readonly buckets: ReadonlyArray<number>
    readonly benchCpuUs: number
  }
  | { readonly type: "closed" }
  | { readonly type: "failed"; readonly error: string }

/** 2% wide buckets from 1 µs: a percentile read from them is within 2% of the sample's. */
const GROWTH = 1.02
const LOG_GROWTH = Math.log(GROWTH)
/** Up to 1.02^1000 µs, about 7 minutes; the last bucket holds everything undelivered. */
const BUCKETS = 1001

export class Histogram {
  private readonly counts = new Array<number>(BUCKETS).fill(0)

  add(us: number) {
    const i = us <= 1 ? 0 : Math.min(BUCKETS - 2, Math.floor(Math.log(us) / LOG_GROWTH))
    this.counts[i] = (this.counts[i] ?? 0) + 1
  }

  /** The counts, with `infinite` more in the last bucket. */
  buckets(infinite: number): ReadonlyArray<number> {
    const out = this.counts.slice()
    out[BUCKETS - 1] = (out[BUCKETS - 1] ?? 0) + infinite
    return out
  }
}

/** Sums histograms' buckets. */
export const merge = (all: ReadonlyArray<ReadonlyArray<number>>): ReadonlyArray<number> =>
  Array.from({ length: BUCKETS }, (_, i) => all.reduce((sum, b) => sum + (b[i] ?? 0), 0))

/** The `p`th percentile in µs (a bucket's lower bound), Infinity when it falls among the undelivered. */
export const percentileOf = (buckets: ReadonlyArray<number>, p: number) => {
  const total = buckets.reduce((a, b) => a + b, 0)
  if (total === 0) return NaN
  const rank = Math.min(total - 1, Math.floor((p / 100) * total))
  let seen = 0
  for (let i = 0; i < buckets.length; i++) {
    seen += buckets[i] ?? 0
    if (seen > rank) return i === BUCKETS - 1 ? Infinity : i === 0 ? 1 : GROWTH ** i
  }
  return Infinity
}
