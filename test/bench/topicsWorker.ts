/**
 * One load process of the mcpx-topics suite (topics.ts): it holds the sockets of a block of whole
 * topics, so that a chat's send and its deliveries are timed by one clock, and so that no process
 * holds more sockets than its file-descriptor limit allows (25,000 do not fit under 20,000).
 * Driven over the IPC channel: `join`, then `chat`; it answers each with its results.
 */
import * as Effect from "effect/Effect"
import { WebSocket } from "ws"
import { issueToken } from "./tokens.ts"
import { Histogram, type TopicsCommand, type TopicsReply } from "./topicsWire.ts"

const MARK = Buffer.from(`"id":"~`)
const WELCOME = Buffer.from(`"event":"welcome"`)
const ERROR = Buffer.from(`"event":"error"`)
const DOT = 0x2e
const QUOTE = 0x22
const ZERO = 0x30
const TICK_MS = 5
const JOIN_ATTEMPTS = 5
const TEXT = "open-loop chat from the bench, about as long as a line people type"

const reply = (message: TopicsReply) => process.send?.(message)
const delay = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** Topic `t` of this worker's block, participant `j` of it, as socket `t * size + j`. */
let sockets: Array<WebSocket> = []
let size = 0
let topics = 0
let firstTopic = 0
/** Sockets whose join has started. */
let joined = 0
let retries = 0
/** When each topic's publisher (its participant 0) sent each chat, by seq. */
let sentAt: Array<Array<number>> = []
let histogram = new Histogram()
let delivered = 0
let measuring = false
let refused = 0
let closed = 0
let closing = false

const onChat = (data: Buffer, at: number) => {
  const now = performance.now()
  let i = at + MARK.length
  let t = 0
  for (let c = data[i++] ?? QUOTE; c !== DOT && c !== QUOTE; c = data[i++] ?? QUOTE) t = t * 10 + c - ZERO
  let seq = 0
  for (let c = data[i++] ?? QUOTE; c !== QUOTE; c = data[i++] ?? QUOTE) seq = seq * 10 + c - ZERO
  const sent = sentAt[t]?.[seq]
  if (sent === undefined) return
  if (measuring) histogram.add((now - sent) * 1000)
  delivered++
}

const join = (index: number, url: string, token: string) =>
  new Promise<void>((resolve, reject) => {
    const ws = new WebSocket(`${url}&token=${encodeURIComponent(token)}`, { perMessageDeflate: false })
    sockets[index] = ws
    let welcomed = false
    const timer = setTimeout(() => reject(new Error(`socket ${index} was not welcomed within 30 s`)), 30_000)
    ws.on("message", (data: Buffer) => {
      const at = data.indexOf(MARK)
      if (at >= 0) return onChat(data, at)
      if (!welcomed && data.includes(WELCOME)) {
        welcomed = true
        clearTimeout(timer)
        return resolve()
      }
      if (data.includes(ERROR) && refused++ === 0) console.error(`mcpx-topics: the gateway refused a chat: ${data.toString()}`)
    })
    ws.once("error", (e) => {
      clearTimeout(timer)
      reject(e)
    })
    ws.once("close", (code, reason) => {
      clearTimeout(timer)
      if (!welcomed) return reject(new Error(`socket ${index} closed before the welcome: ${code} ${reason.toString()}`))
      if (!closing && closed++ === 0) console.error(`mcpx-topics: a socket was closed: ${code} ${reason.toString()}`)
    })
  })

/**
 * Joins the block's participants up to topic `upTo`, from where the last join left off,
 * `inFlight` handshakes at a time, each topic's members dealt over the edges in turn.
 */
const joinAll = async (command: Extract<TopicsCommand, { readonly type: "join" }>) => {
  if (sockets.length === 0) {
    size = command.size
    topics = command.topics
    firstTopic = command.firstTopic
    sockets = new Array<WebSocket>(topics * size)
    sentAt = Array.from({ length: topics }, () => [])
  }
  const started = performance.now()
  const end = Math.min(command.upTo, topics) * size
  const lane = async () => {
    while (joined < end) {
      const index = joined++
      const t = Math.floor(index / size)
      const j = index % size
      const global = firstTopic + t
      const base = command.urls[(global * size + j) % command.urls.length] ?? ""
      const token = await Effect.runPromise(issueToken({ sub: `t${global}p${j}`, ttl: "1 hour" }))
      const url = `${base}/v0/ws?topic=${command.topicPrefix}${global}`
      // A join the edge turns away (1013: the broker did not take it in time) is tried again after
      // a backoff, as a client would; the retries are reported, since they are the overload's cost.
      for (let attempt = 1; ; attempt++) {
        try {
          await join(index, url, token)
          break
        } catch (e) {
          if (attempt >= JOIN_ATTEMPTS || !(e instanceof Error) || !e.message.includes(" 1013 ")) throw e
          retries++
          await delay(100 * 2 ** attempt)
        }
      }
    }
  }
  await Promise.all(Array.from({ length: command.inFlight }, lane))
  reply({ type: "joined", seconds: (performance.now() - started) / 1000, retries })
}

/** Open loop: the block's share of the rate, each topic's participant 0 in turn, on a timer that keeps to the schedule. */
const chat = async (command: Extract<TopicsCommand, { readonly type: "chat" }>) => {
  histogram = new Histogram()
  delivered = 0
  let sent = 0
  let turn = 0
  const send = () => {
    const t = turn
    turn = (turn + 1) % topics
    const times = sentAt[t]
    const ws = sockets[t * size]
    if (times === undefined || ws === undefined) return
    const seq = times.length
    times.push(performance.now())
    sent++
    ws.send(`{"protocol":"mcpx/v0.1","id":"~${t}.${seq}","from":"t${firstTopic + t}p0","kind":"chat","payload":{"text":"${TEXT}"}}`)
  }
  const cpu = process.cpuUsage()
  measuring = true
  const start = performance.now()
  await new Promise<void>((resolve) => {
    const pace = setInterval(() => {
      const due = Math.floor(((performance.now() - start) / 1000) * command.rate)
      while (sent < due) send()
    }, TICK_MS)
    setTimeout(() => {
      clearInterval(pace)
      resolve()
    }, command.seconds * 1000)
  })
  const seconds = (performance.now() - start) / 1000
  const inWindow = delivered
  const used = process.cpuUsage(cpu)
  // Every chat is owed to each of its topic's members, its sender included.
  const owed = sent * size
  const drainUntil = performance.now() + command.drainSeconds * 1000
  while (delivered < owed && performance.now() < drainUntil) await delay(10)
  measuring = false
  const undelivered = Math.max(0, owed - delivered)
  reply({
    type: "chatted",
    seconds,
    sent,
    delivered: inWindow,
    undelivered,
    refused,
    closed,
    buckets: histogram.buckets(undelivered),
    benchCpuUs: used.user + used.system
  })
}

process.on("message", (message: TopicsCommand) => {
  const done = message.type === "join" ? joinAll(message) : message.type === "chat" ? chat(message) : Promise.resolve(close())
  done.catch((e: unknown) => {
    reply({ type: "failed", error: e instanceof Error ? e.message : String(e) })
  })
})

const close = () => {
  closing = true
  for (const ws of sockets) ws.terminate()
  reply({ type: "closed" })
}

reply({ type: "ready" })
