/**
 * What the traffic saw, phase by phase: every attempt of every request with its outcome and times,
 * every request's final outcome after the client's retries, and the MCPx envelopes each sender had
 * acknowledged and each receiver saw. The table of issue 18 is computed from it at the end.
 */
export type Protocol = "proxy" | "mcpx" | "hub"

export type Outcome = "correct" | "error" | "wrong"

export interface Attempt {
  readonly protocol: Protocol
  /** `proxy/1`: the protocol and the flow's number. */
  readonly flow: string
  readonly phase: number
  readonly sentAt: number
  readonly endedAt: number
  readonly outcome: Outcome
  /** What went wrong, for the log: an error's message, "timeout", "socket closed". */
  readonly detail?: string
}

export interface Request {
  readonly protocol: Protocol
  readonly flow: string
  readonly phase: number
  /** Answered correctly within the retry policy. */
  readonly ok: boolean
}

export interface Phase {
  readonly name: string
  readonly startedAt: number
  /** Faults only: when the fault was injected (recovery is measured from here). */
  readonly faultAt?: number
  /** Flows with no socket on the faulted edge (the edge fault only). */
  readonly bystanders?: ReadonlySet<string>
}

export interface Row {
  readonly phase: string
  readonly sent: number
  readonly correct: number
  readonly errors: number
  readonly wrong: number
  /** Requests that still failed after the client's retries. */
  readonly failedAfterRetry: number
  readonly lostAckedEnvelopes: number
  readonly lostKvState: number
  /** Errors on flows that had no socket on the faulted component (the edge fault). */
  readonly bystanderErrors?: number
  /** Milliseconds from the fault until every flow answered correctly again; undefined if never. */
  readonly recoveryMs?: number | undefined
  /** The flow that took longest to recover (or never did). */
  readonly slowest?: string
}

export class Ledger {
  readonly attempts: Array<Attempt> = []
  readonly requests: Array<Request> = []
  readonly phases: Array<Phase> = []
  /** Envelope id → the phase it was sent in and when its sender saw it acknowledged. */
  readonly acked = new Map<string, {
    readonly phase: number
    readonly sentAt: number
    readonly at: number
    readonly payload: string
    /** The topic sent it back to its sender, or refused a resend as `duplicate_id` (accepted before). */
    readonly how: "echo" | "duplicate_id"
  }>()
  /** Participant → when its first welcome arrived: only envelopes sent after that must reach it. */
  readonly joined = new Map<string, number>()
  /** Participant → envelope ids it saw (live, or from history after a reconnect). */
  readonly received = new Map<string, Set<string>>()
  /** Envelopes a receiver saw with another payload than the one sent under that id. */
  readonly wrongEnvelopes: Array<{ readonly phase: number; readonly id: string; readonly by: string }> = []
  /** Phase → KV records (of the state written before the faults) missing or changed after it. */
  readonly lostKv = new Map<number, number>()

  get phase(): number {
    return this.phases.length - 1
  }

  begin(phase: Omit<Phase, "startedAt">): number {
    this.phases.push({ ...phase, startedAt: Date.now() })
    return this.phase
  }

  attempt(a: Omit<Attempt, "phase" | "endedAt"> & { readonly phase: number }): void {
    this.attempts.push({ ...a, endedAt: Date.now() })
  }

  seen(participant: string, id: string): void {
    let ids = this.received.get(participant)
    if (ids === undefined) this.received.set(participant, (ids = new Set()))
    ids.add(id)
  }

  /** Flows whose latest attempt sent after `since` answered correctly, by flow. */
  healthySince(since: number): ReadonlySet<string> {
    const last = new Map<string, Attempt>()
    for (const a of this.attempts) {
      if (a.sentAt < since) continue
      const before = last.get(a.flow)
      if (before === undefined || before.sentAt <= a.sentAt) last.set(a.flow, a)
    }
    return new Set([...last].filter(([, a]) => a.outcome === "correct").map(([flow]) => flow))
  }

  rows(participants: ReadonlyArray<string>): ReadonlyArray<Row> {
    return this.phases.map((phase, i) => {
      const attempts = this.attempts.filter((a) => a.phase === i)
      const count = (o: Outcome) => attempts.filter((a) => a.outcome === o).length
      const lost = this.lost(participants).filter((l) => l.phase === i)
      return {
        phase: phase.name,
        sent: attempts.length,
        correct: count("correct"),
        errors: count("error"),
        wrong: count("wrong") + this.wrongEnvelopes.filter((w) => w.phase === i).length,
        failedAfterRetry: this.requests.filter((r) => r.phase === i && !r.ok).length,
        lostAckedEnvelopes: lost.length,
        lostKvState: this.lostKv.get(i) ?? 0,
        ...(phase.bystanders === undefined
          ? {}
          : { bystanderErrors: attempts.filter((a) => a.outcome !== "correct" && phase.bystanders?.has(a.flow)).length }),
        ...(phase.faultAt === undefined ? {} : (({ ms, slowest }) => ({ recoveryMs: ms, slowest }))(this.recovery(i, phase.faultAt)))
      }
    })
  }

  /** Acknowledged envelopes that a participant joined before they were sent never saw. */
  lost(participants: ReadonlyArray<string>): ReadonlyArray<
    { readonly id: string; readonly phase: number; readonly at: number; readonly how: "echo" | "duplicate_id"; readonly missing: ReadonlyArray<string> }
  > {
    return [...this.acked].flatMap(([id, e]) => {
      const missing = participants.filter((p) => (this.joined.get(p) ?? Infinity) < e.sentAt && !(this.received.get(p)?.has(id) ?? false))
      return missing.length === 0 ? [] : [{ id, phase: e.phase, at: e.at, how: e.how, missing }]
    })
  }

  /**
   * From the fault until the last flow's first correct answer after its last failure in the phase
   * (a flow that never failed counts from its first correct answer after the fault). The answer
   * may come after the phase: an attempt sent late in it can fail after it.
   */
  private recovery(phase: number, faultAt: number): { readonly ms: number | undefined; readonly slowest: string } {
    const flows = new Set(this.attempts.map((a) => a.flow))
    let worst = { ms: 0 as number | undefined, slowest: "" }
    for (const flow of flows) {
      const mine = this.attempts.filter((a) => a.flow === flow && a.sentAt >= faultAt).sort((a, b) => a.endedAt - b.endedAt)
      const lastFailure = mine.reduce((t, a) => (a.phase === phase && a.outcome !== "correct" ? Math.max(t, a.endedAt) : t), faultAt)
      const recovered = mine.find((a) => a.outcome === "correct" && a.endedAt >= lastFailure)
      if (recovered === undefined) return { ms: undefined, slowest: flow }
      if (worst.ms !== undefined && recovered.endedAt - faultAt > worst.ms) worst = { ms: recovered.endedAt - faultAt, slowest: flow }
    }
    return worst
  }
}

const cell = (n: number | undefined) => (n === undefined ? "never" : String(n))

export const markdown = (rows: ReadonlyArray<Row>): string =>
  [
    "| phase | sent | correct | errors | wrong | failed after retry | lost acked MCPx envelopes | lost KV state | recovery ms |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ...rows.map((r) =>
      `| ${r.phase}${r.bystanderErrors === undefined ? "" : ` (errors on flows not on that edge: ${r.bystanderErrors})`} | ${r.sent} | ${r.correct} | ${r.errors} | ${r.wrong} | ${r.failedAfterRetry} | ${r.lostAckedEnvelopes} | ${r.lostKvState} | ${
        !("recoveryMs" in r) ? "–" : `${cell(r.recoveryMs)} (${r.slowest})`
      } |`
    )
  ].join("\n")
