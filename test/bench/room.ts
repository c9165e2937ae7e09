/**
 * Open-loop load on one MCPx topic. Every participant is a socket of this process, so one clock
 * times each chat from its send to its delivery at every member. A few participants publish at a
 * total rate paced by a timer: sends keep to the schedule however far behind the deliveries are,
 * so a broker that cannot keep up shows as latency and backlog, not as a politely lower rate.
 */
import { WebSocket } from "ws"
import { percentile } from "./load.ts"

export interface RoomOptions {
  /** Edge base URLs (`ws://host:port`); participant i joins through `urls[i % urls.length]`. */
  readonly urls: ReadonlyArray<string>
  readonly topic: string
  /** Participant ids with a token whose `sub` is that id. */
  readonly participants: ReadonlyArray<{ readonly id: string; readonly token: string }>
  /** How many participants (the first ones, so one per edge in turn) also publish. */
  readonly publishers: number
}

export interface StepOptions {
  /** Chats per second offered by all publishers together. */
  readonly rate: number
  readonly seconds: number
  /** How long deliveries may still arrive after the last send before they count as undelivered. */
  readonly drainSeconds: number
  /** Sending stops early once p99 over the step's deliveries is sure to exceed this. */
  readonly giveUpMs: number
  /** Called as sending starts and stops, so that callers sample server CPU over exactly that window. */
  readonly onWindow?: (edge: "open" | "close") => void
}

export interface StepResult {
  /** How long the publishers sent. */
  readonly seconds: number
  readonly sent: number
  /** Chat deliveries to all participants while the publishers sent. */
  readonly delivered: number
  /**
   * Over every delivery the step's chats owed (sent × open participants); one still missing after
   * the drain counts as infinitely late, so a percentile it reaches is `Infinity`.
   */
  readonly p50Us: number
  readonly p99Us: number
  readonly undelivered: number
  /** Participants whose chats did not arrive in the same order as everyone else's. */
  readonly misordered: number
  /** Chats that arrived out of their publisher's own order (or after one went missing). */
  readonly gaps: number
  /** Error envelopes from the gateway (rate limits, refusals): each is a chat that went nowhere. */
  readonly refused: number
  /** Sockets closed during the step (the edge closes slow consumers with 1013). */
  readonly closed: number
  /** Why sending stopped before `seconds`, if it did. */
  readonly stopped: string | undefined
  /** This process's CPU over the window, in % of one core: a saturated generator times itself. */
  readonly benchCpuPct: number
}

export interface Room {
  readonly step: (options: StepOptions) => Promise<StepResult>
  readonly close: () => void
}

const TICK_MS = 2
const CHECK_MS = 100
const JOIN_BATCH = 20
/** Our chat ids are `~<publisher>.<seq>`; the gateway's own envelopes have UUIDs. */
const MARK = Buffer.from(`"id":"~`)
const WELCOME = Buffer.from(`"event":"welcome"`)
const ERROR = Buffer.from(`"event":"error"`)
const DOT = 0x2e
const QUOTE = 0x22
const ZERO = 0x30
const TEXT = "open-loop chat from the bench, about as long as a line people type"

const delay = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** The first index in `times[from, to)` at or after `t` (`times` ascends). */
const firstAtOrAfter = (times: ReadonlyArray<number>, from: number, to: number, t: number) => {
  let lo = from
  let hi = to
  while (lo < hi) {
    const mid = (lo + hi) >>> 1
    if ((times[mid] ?? Infinity) < t) lo = mid + 1
    else hi = mid
  }
  return lo
}

/** Per-step counters, replaced as each step starts. */
interface StepState {
  /** Each publisher's first seq of this step. */
  readonly first: Array<number>
  readonly latenciesUs: Array<number>
  /** Each participant's deliveries of this step, as `seq * publishers + publisher`. */
  readonly logs: Array<Array<number>>
  measuring: boolean
  delivered: number
  late: number
  lateAfterMs: number
  gaps: number
  refused: number
  closed: number
}

/** Joins every participant (each is welcomed before this resolves); the room is then ready for steps. */
export const openRoom = async (options: RoomOptions): Promise<Room> => {
  const n = options.participants.length
  const publishers = Math.min(options.publishers, n)
  /** When each publisher sent each of its chats (performance.now()), by seq. */
  const sentAt: Array<Array<number>> = Array.from({ length: publishers }, () => [])
  /** The last seq participant p received from publisher k, at `p * publishers + k`. */
  const last = new Int32Array(n * publishers).fill(-1)
  const sockets: Array<WebSocket | undefined> = new Array<WebSocket | undefined>(n).fill(undefined)
  const open: Array<boolean> = new Array<boolean>(n).fill(false)
  /** Set once the room is being torn down, when closes are ours. */
  let closing = false
  const newStep = (lateAfterMs: number): StepState => ({
    first: sentAt.map((times) => times.length),
    latenciesUs: [],
    logs: Array.from({ length: n }, () => []),
    measuring: false,
    delivered: 0,
    late: 0,
    lateAfterMs,
    gaps: 0,
    refused: 0,
    closed: 0
  })
  let step = newStep(Infinity)

  /** The hot path, hundreds of thousands of frames a second: chats are recognised by their id, not parsed. */
  const onChat = (p: number, data: Buffer, at: number) => {
    const now = performance.now()
    let i = at + MARK.length
    let k = 0
    for (let c = data[i++] ?? QUOTE; c !== DOT && c !== QUOTE; c = data[i++] ?? QUOTE) k = k * 10 + c - ZERO
    let seq = 0
    for (let c = data[i++] ?? QUOTE; c !== QUOTE; c = data[i++] ?? QUOTE) seq = seq * 10 + c - ZERO
    const sent = sentAt[k]?.[seq]
    if (sent === undefined) return
    const slot = p * publishers + k
    const previous = last[slot] ?? -1
    if (seq !== previous + 1) step.gaps++
    if (seq > previous) last[slot] = seq
    if (step.measuring) step.delivered++
    if (seq < (step.first[k] ?? 0)) return
    step.logs[p]?.push(seq * publishers + k)
    const ms = now - sent
    step.latenciesUs.push(ms * 1000)
    if (ms > step.lateAfterMs) step.late++
  }

  const join = (p: number) =>
    new Promise<void>((resolve, reject) => {
      const participant = options.participants[p]
      const base = options.urls[p % options.urls.length]
      if (participant === undefined || base === undefined) return reject(new Error(`no participant ${p} or no edge URL`))
      const url = `${base}/v0/ws?topic=${encodeURIComponent(options.topic)}&token=${encodeURIComponent(participant.token)}`
      const ws = new WebSocket(url, { perMessageDeflate: false })
      sockets[p] = ws
      const timer = setTimeout(() => reject(new Error(`${participant.id} was not welcomed within 15 s`)), 15_000)
      ws.on("message", (data: Buffer) => {
        const at = data.indexOf(MARK)
        if (at >= 0) return onChat(p, data, at)
        if (!open[p] && data.includes(WELCOME)) {
          open[p] = true
          clearTimeout(timer)
          return resolve()
        }
        if (data.includes(ERROR)) {
          if (step.refused++ === 0) console.error(`mcpx: the gateway refused a chat of ${participant.id}: ${data.toString()}`)
        }
      })
      ws.once("error", (e) => {
        clearTimeout(timer)
        reject(e)
      })
      ws.once("close", (code, reason) => {
        clearTimeout(timer)
        if (!open[p]) return reject(new Error(`${participant.id}'s socket closed before the welcome: ${code} ${reason.toString()}`))
        open[p] = false
        if (!closing && step.closed++ === 0) console.error(`mcpx: ${participant.id}'s socket was closed: ${code} ${reason.toString()}`)
      })
    })

  const close = () => {
    closing = true
    for (const ws of sockets) ws?.terminate()
  }
  try {
    for (let from = 0; from < n; from += JOIN_BATCH) {
      await Promise.all(Array.from({ length: Math.min(JOIN_BATCH, n - from) }, (_, i) => join(from + i)))
    }
  } catch (e) {
    close()
    throw e
  }

  /** Deliveries this step still owes to open participants, and how many of them are older than `before`. */
  const owed = (before: number) => {
    let missing = 0
    let overdue = 0
    for (let k = 0; k < publishers; k++) {
      const times = sentAt[k] ?? []
      const first = step.first[k] ?? 0
      const cut = firstAtOrAfter(times, first, times.length, before)
      for (let p = 0; p < n; p++) {
        if (!open[p]) continue
        const next = Math.max((last[p * publishers + k] ?? -1) + 1, first)
        missing += Math.max(0, times.length - next)
        overdue += Math.max(0, cut - next)
      }
    }
    return { missing, overdue }
  }

  const runStep = async (o: StepOptions): Promise<StepResult> => {
    const state = (step = newStep(o.giveUpMs))
    const perPublisher = o.rate / publishers
    const send = (k: number) => {
      const times = sentAt[k]
      const ws = sockets[k]
      const participant = options.participants[k]
      if (times === undefined || ws === undefined || participant === undefined) return
      const seq = times.length
      times.push(performance.now())
      ws.send(`{"protocol":"mcpx/v0.1","id":"~${k}.${seq}","from":"${participant.id}","kind":"chat","payload":{"text":"${TEXT}"}}`)
    }

    let stopped: string | undefined
    const cpu = process.cpuUsage()
    o.onWindow?.("open")
    state.measuring = true
    const start = performance.now()
    await new Promise<void>((resolve) => {
      // Publisher k is a k/publishers phase behind the others, so that their sends interleave.
      const pace = setInterval(() => {
        const elapsed = (performance.now() - start) / 1000
        for (let k = 0; k < publishers; k++) {
          const due = (state.first[k] ?? 0) + Math.floor(elapsed * perPublisher + k / publishers)
          while ((sentAt[k]?.length ?? due) < due) send(k)
        }
      }, TICK_MS)
      const finish = (why?: string) => {
        stopped = why
        clearInterval(pace)
        clearInterval(check)
        clearTimeout(end)
        resolve()
      }
      const check = setInterval(() => {
        if (state.closed > 0) return finish(`${state.closed} sockets closed`)
        // A refused chat is never delivered: the limits were not lifted, and the step measures them instead.
        if (state.refused > 0) return finish(`${state.refused} chats refused`)
        const { missing, overdue } = owed(performance.now() - o.giveUpMs)
        const owedSoFar = state.latenciesUs.length + missing
        // Late deliveries and deliveries not yet made that are already late: once they are more
        // than 1% of what is owed, p99 is past the limit whatever happens next.
        if (state.late + overdue > owedSoFar / 100 && owedSoFar > 0) finish(`p99 over ${o.giveUpMs} ms`)
      }, CHECK_MS)
      const end = setTimeout(() => finish(), o.seconds * 1000)
    })
    state.measuring = false
    const seconds = (performance.now() - start) / 1000
    o.onWindow?.("close")
    const used = process.cpuUsage(cpu)

    const drainUntil = performance.now() + o.drainSeconds * 1000
    while (owed(Infinity).missing > 0 && performance.now() < drainUntil) await delay(10)
    const undelivered = owed(Infinity).missing

    // Everyone must have seen the same sequence: compare each log with the longest one.
    const reference = state.logs.reduce((a, b) => (b.length > a.length ? b : a), [])
    let misordered = 0
    for (const log of state.logs) {
      for (let i = 0; i < log.length; i++) {
        if (log[i] !== reference[i]) {
          misordered++
          break
        }
      }
    }

    const sorted = Float64Array.from(state.latenciesUs.concat(new Array<number>(undelivered).fill(Infinity))).sort()
    return {
      seconds,
      sent: sentAt.reduce((sum, times, k) => sum + times.length - (state.first[k] ?? 0), 0),
      delivered: state.delivered,
      p50Us: percentile(sorted, 50),
      p99Us: percentile(sorted, 99),
      undelivered,
      misordered,
      gaps: state.gaps,
      refused: state.refused,
      closed: state.closed,
      stopped,
      benchCpuPct: ((used.user + used.system) / 1000 / (seconds * 1000)) * 100
    }
  }

  return { step: runStep, close }
}
