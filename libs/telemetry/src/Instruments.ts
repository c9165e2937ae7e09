/**
 * The metrics every Switchboard service reports, by the names the dashboard and the alerts use.
 * Each function takes the registry and returns what the instrumented code keeps and bumps; the
 * code it instruments needs one line per event and no knowledge of names or labels.
 */
import type { Cell, HistogramCell, Reading, Registry } from "./Metrics.ts"

/** What an actor is, from how its connection was opened: one label value per role the specs name. */
const ROLES: Readonly<Record<string, string>> = {
  "/mcp": "client",
  "/extension": "extension",
  "/v0/ws": "participant",
  "/tabs": "tab",
  "/hub": "hub"
}

export const actorKind = (open: { readonly path: string; readonly transport?: "http" | undefined }): string => {
  const role = ROLES[open.path] ?? open.path
  return open.transport === "http" ? `${role}-http` : role
}

/** What an actor host reports: its actors by kind, and the connections it adopted. */
export const actorHost = (registry: Registry, service: string) => {
  const actors = registry.gauge("switchboard_actors", "Connection actors this process hosts, by service and kind", ["service", "kind"])
  const adoptions = registry.counter(
    "switchboard_adoptions_total",
    "Connections adopted from a replica that stopped or died",
    ["service"]
  ).labels(service)
  const handedOff = handoffs(registry, service)
  return {
    /**
     * Counts the host's actors by kind when scraped, from how each was opened (`hosted`: the
     * host's own records), until the returned function removes it. A count kept per actor took a
     * finalizer in every connection's scope, about 250 bytes of each idle socket (issue 29). A
     * kind once seen stays reported, at 0 when its actors are gone.
     */
    follow: (hosted: () => Iterable<Parameters<typeof actorKind>[0]>): () => void => {
      const seen = new Set<string>()
      return actors.collect(() => {
        const counts = new Map<string, number>()
        for (const kind of seen) counts.set(kind, 0)
        for (const open of hosted()) {
          const kind = actorKind(open)
          counts.set(kind, (counts.get(kind) ?? 0) + 1)
        }
        for (const kind of counts.keys()) seen.add(kind)
        return [...counts].map(([kind, n]): Reading => [[service, kind], n])
      })
    },
    adopted: () => void adoptions.value++,
    /** For the graceful hand-off: one connection given to a surviving replica. */
    handedOff: () => void handedOff.value++
  }
}

/**
 * Connections a stopping replica handed to a survivor (graceful hand-off). Declared with every
 * actor host so the series exists at 0 before the first hand-off.
 */
export const handoffs = (registry: Registry, service: string): Cell =>
  registry.counter("switchboard_handoffs_total", "Connections handed to another replica by one that was stopping", ["service"]).labels(service)

/** The shape `TimedMap` keeps up to date: requests awaiting an answer, and those that never got one in time. */
export interface InFlight {
  readonly pending: Cell
  readonly timeouts: Cell
}

/** Requests a service waits on (forwarded to an extension, tool calls sent to a tab) and their timeouts. */
export const requests = (registry: Registry, service: string): InFlight => ({
  pending: registry.gauge("switchboard_pending_requests", "Requests waiting for an answer, with a deadline", ["service"]).labels(service),
  timeouts: registry.counter("switchboard_request_timeouts_total", "Requests that got no answer before their deadline", ["service"]).labels(service)
})

export type ToolCallOutcome = "ok" | "error" | "timeout" | "not_found" | "cancelled"

/**
 * Hub tool calls by how they ended: `ok` (the tab's result), `error` (the tab failed or reported
 * an error, or the call could not be delivered), `timeout`, `not_found` (no tab has the tool),
 * `cancelled` (the tab cancelled it).
 */
export const toolCalls = (registry: Registry) => {
  const family = registry.counter("switchboard_tool_calls_total", "Hub tool calls by outcome", ["outcome"])
  const cells = new Map<ToolCallOutcome, Cell>()
  return (outcome: ToolCallOutcome) => {
    let cell = cells.get(outcome)
    if (cell === undefined) cells.set(outcome, (cell = family.labels(outcome)))
    cell.value++
  }
}

export type TokenOutcome = "valid" | "expired" | "invalid"

/**
 * The auth service's token checks: by outcome (`expired` apart from the other refusals, since a
 * wave of them points at clients that do not refresh), and how long a check took.
 */
export const tokenChecks = (registry: Registry) => {
  const family = registry.counter("switchboard_token_checks_total", "Token verifications answered by the auth service, by outcome", ["outcome"])
  const seconds = registry.histogram("switchboard_token_check_seconds", "Time to verify one token").labels()
  const cells: Record<TokenOutcome, Cell> = { valid: family.labels("valid"), expired: family.labels("expired"), invalid: family.labels("invalid") }
  return (outcome: TokenOutcome, elapsed: number) => {
    cells[outcome].value++
    seconds.observe(elapsed)
  }
}

export type KvOutcome = "ok" | "conflict" | "error"

/**
 * KV operations: latency by operation and outcome; errors (not compare-and-set conflicts) by
 * operation. `op` resolves one operation's series once, so timing a call looks nothing up.
 */
export const kv = (registry: Registry) => {
  const seconds = registry.histogram("switchboard_kv_op_seconds", "KV operation latency", ["op", "outcome"])
  const errors = registry.counter("switchboard_kv_errors_total", "KV operations that failed (a conflict is not a failure)", ["op"])
  return {
    op: (op: string) => {
      // Made on first use, so only outcomes that happened are listed.
      let ok: HistogramCell | undefined
      let conflict: HistogramCell | undefined
      let failed: HistogramCell | undefined
      let failures: Cell | undefined
      return (outcome: KvOutcome, elapsed: number) => {
        if (outcome === "ok") return (ok ??= seconds.labels(op, "ok")).observe(elapsed)
        if (outcome === "conflict") return (conflict ??= seconds.labels(op, "conflict")).observe(elapsed)
        failed ??= seconds.labels(op, "error")
        failures ??= errors.labels(op)
        failed.observe(elapsed)
        failures.value++
      }
    }
  }
}

/** The topic a history key stands for: keys are base64url (`Subjects.historyKey`). */
const topicOf = (key: string) => Buffer.from(key, "base64url").toString("utf8")

/**
 * Journal appends. On NATS an append is acknowledged later (see `JournalAppender`): its latency is
 * the time to that acknowledgement, and an attempt that fails counts an error.
 *
 * `switchboard_sequencer_lag{topic}` is the number of the topic's envelopes this process has
 * accepted but whose history append JetStream has not acknowledged yet: the topic's sequencer
 * sends out only what is stored, so these are envelopes its members have not received. It is 0
 * in steady state and grows while the history stream has no leader. Topics at 0 are not listed,
 * so the series stay as few as the topics that lag. Observed per journal key, which for the
 * history is the topic.
 */
export const journal = (registry: Registry): JournalObserver => {
  const found = journals.get(registry)
  if (found !== undefined) return found
  const made = makeJournal(registry)
  journals.set(registry, made)
  return made
}

/** One per registry: its lag gauge reads one map, however many bus layers a test process builds. */
const journals = new WeakMap<Registry, JournalObserver>()

const makeJournal = (registry: Registry) => {
  const seconds = registry.histogram("switchboard_journal_append_seconds", "Time from a journal append to its acknowledgement").labels()
  const errors = registry.counter("switchboard_journal_errors_total", "Journal append attempts that failed (each is retried until it gives up)").labels()
  const lag = new Map<string, number>()
  registry.gauge("switchboard_sequencer_lag", "Envelopes accepted but not yet stored in the topic's history, so not yet sent to its members", ["topic"]).collect(
    function*(): Iterable<Reading> {
      for (const [name, n] of lag) yield [[topicOf(name)], n]
    }
  )
  const settle = (name: string, n: number) => {
    const left = (lag.get(name) ?? 0) - n
    if (left > 0) lag.set(name, left)
    else lag.delete(name)
  }
  return {
    appended: (name: string) => void lag.set(name, (lag.get(name) ?? 0) + 1),
    stored: (name: string, elapsed: number) => {
      seconds.observe(elapsed)
      settle(name, 1)
    },
    failed: () => void errors.value++,
    lost: (name: string, count: number) => settle(name, count)
  }
}
export type JournalObserver = ReturnType<typeof makeJournal>
