/**
 * The host's records of its connections (`HostedActors`), through their own interface and with no
 * bus: forgetting a connection leaves nothing of it behind in any view the host asks for (local
 * peers, liveness, the hand-off, the stop, the edge check), and a connection handed away is
 * neither local nor handed over again, though it runs until its end forgets it.
 */
import { describe, expect, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as FiberSet from "effect/FiberSet"
import { annotated, type HostedRecord, HostedActors } from "../src/HostedActor.ts"
import { Mailbox } from "../src/Mailbox.ts"
import * as Subjects from "../src/Subjects.ts"

/** A record as the host keeps one, with a real mailbox; what it handled is in `handled`. */
const record = (conn: string, edge: string, options: { readonly http?: boolean; readonly running?: boolean } = {}) =>
  Effect.gen(function*() {
    const handled: Array<string> = []
    const mailbox = new Mailbox<never>(yield* FiberSet.makeRuntime<never>())
    if (options.running === true) mailbox.start((m) => void handled.push(m === "edge-lost" ? m : "message"))
    const r: HostedRecord<never> & { owned: boolean } = {
      conn: Subjects.ConnId(conn),
      edge: Subjects.EdgeId(edge),
      open: { path: options.http === true ? "/hub" : "/mcp", query: {}, openedAt: 0, ...(options.http === true ? { transport: "http" as const } : {}) },
      http: options.http ?? false,
      mailbox,
      owned: true,
      running: options.running ?? false
    }
    return { record: r, handled }
  })

const conns = (records: ReadonlyArray<HostedRecord<never>>) => records.map((r) => r.conn).sort()

/** A host's records, holding these. */
const holding = (...held: ReadonlyArray<{ readonly record: HostedRecord<never> }>) => {
  const actors = new HostedActors<never, never, HostedRecord<never>>()
  for (const { record } of held) actors.add(record)
  return actors
}

describe("the host's records of its connections", () => {
  it.scoped("a connection forgotten leaves nothing behind: not owned, not local, not handed over, not stopped, on no edge", () =>
    Effect.gen(function*() {
      const a = yield* record("a", "e1", { running: true })
      const b = yield* record("b", "e1", { running: true })
      const actors = holding(a, b)
      expect(actors.owns(Subjects.ConnId("a"))).toBe(true)

      actors.forget(Subjects.ConnId("a"), a.record.mailbox)
      expect(actors.size).toBe(1)
      expect(actors.get(Subjects.ConnId("a"))).toBeUndefined()
      expect(actors.owns(Subjects.ConnId("a"))).toBe(false)
      expect(actors.local(Subjects.ConnId("a"))).toBeUndefined()
      expect(conns(actors.owned())).toEqual(["b"])
      expect(conns(actors.running())).toEqual(["b"])
      expect([...actors.socketsByEdge()].map(([edge, sockets]) => [edge, sockets.length])).toEqual([["e1", 1]])
      // Nor in what the metrics count when scraped.
      expect([...actors.opens()]).toHaveLength(1)
      // Its mailbox was stopped with it: what still reaches it is not handled.
      a.record.mailbox.offer("edge-lost")
      b.record.mailbox.offer("edge-lost")
      expect(a.handled).toEqual([])
      expect(b.handled).toEqual(["edge-lost"])

      // Harmless when done twice; the last one forgotten leaves the host empty, its edge too.
      actors.forget(Subjects.ConnId("a"), a.record.mailbox)
      actors.forget(Subjects.ConnId("b"), b.record.mailbox)
      expect(actors.size).toBe(0)
      expect(actors.socketsByEdge().size).toBe(0)
    }))

  it.scoped("a connection handed away is neither local nor handed over again, yet runs and stays on its edge until forgotten", () =>
    Effect.gen(function*() {
      const moved = yield* record("moved", "e1", { running: true })
      const kept = yield* record("kept", "e1", { running: true })
      const actors = holding(moved, kept)
      moved.record.owned = false
      expect(actors.owns(Subjects.ConnId("moved"))).toBe(false)
      expect(actors.local(Subjects.ConnId("moved"))).toBeUndefined()
      expect(actors.local(Subjects.ConnId("kept"))).toBe(kept.record.mailbox)
      expect(conns(actors.owned())).toEqual(["kept"])
      // It ends through its own end, which forgets it: until then a stop or a dead edge still reaches it.
      expect(conns(actors.running())).toEqual(["kept", "moved"])
      expect(actors.socketsByEdge().get(Subjects.EdgeId("e1"))?.length).toBe(2)
    }))

  it.scoped("the edge check sees socket connections by edge; Streamable HTTP sessions and actors not yet running are apart from `running`", () =>
    Effect.gen(function*() {
      const one = yield* record("one", "e1", { running: true })
      const two = yield* record("two", "e2", { running: true })
      const three = yield* record("three", "e2")
      const session = yield* record("session", "e1", { http: true, running: true })
      const actors = holding(one, two, three, session)
      const byEdge = actors.socketsByEdge()
      expect([...byEdge.keys()].sort()).toEqual(["e1", "e2"])
      expect(byEdge.get(Subjects.EdgeId("e1"))).toEqual([one.record.mailbox])
      expect(byEdge.get(Subjects.EdgeId("e2"))).toEqual([two.record.mailbox, three.record.mailbox])
      // One still being adopted (waiting for what the old owner forwards) is not stopped as running.
      expect(conns(actors.running())).toEqual(["one", "session", "two"])
      expect(conns(actors.owned())).toEqual(["one", "session", "three", "two"])
    }))

  it.scoped("forks a connection's fiber with its service and connection in the log annotations, on top of those it inherits", () =>
    Effect.gen(function*() {
      const forked = (service: string, conn: string) =>
        Effect.flatMap(FiberSet.makeRuntime<never>(), (runFork) => Fiber.join(runFork(Effect.logAnnotations, annotated(service, conn))))
      expect(Object.fromEntries(yield* forked("router", "conn-1"))).toEqual({ service: "router", conn: "conn-1" })
      const inherited = yield* forked("broker", "c2").pipe(Effect.annotateLogs({ outer: "kept" }))
      expect(Object.fromEntries(inherited)).toEqual({ outer: "kept", service: "broker", conn: "c2" })
    }))
})
