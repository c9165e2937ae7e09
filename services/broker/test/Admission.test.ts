/** Who may open a participant's socket, in which topic, and with which privilege: admission's rules alone. */
import { describe, expect, it } from "@effect/vitest"
import { type Auth, Edge, Mcpx } from "@switchboard/protocol"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import { admit, privilegeOf } from "../src/Admission.ts"

const open = (query: Record<string, string>, claims?: Auth.Claims): Edge.OpenEvent => ({
  path: "/v0/ws",
  query,
  openedAt: 0,
  ...(claims === undefined ? {} : { claims })
})

/** Why the socket may not join, or `admitted`. */
const verdict = (event: Edge.OpenEvent) =>
  Either.match(admit(event), {
    onLeft: (refuse) => `${refuse.code} ${refuse.reason}`,
    onRight: ({ token, topic }) => `admitted ${token.sub} to ${topic}`
  })

const saved = (privilege: Auth.Privilege, assigned?: boolean): Option.Option<Mcpx.Member> =>
  Option.some({ topic: "room", participant: "alice", privilege, conn: "c1", edge: "e1", joinedAt: 0, ...(assigned === undefined ? {} : { assigned }) })

describe("admission to a topic", () => {
  it("admits a token's subject to the topic it asks for, within the token's topics", () => {
    expect(verdict(open({ topic: "room" }, { sub: "alice" }))).toBe("admitted alice to room")
    expect(verdict(open({ topic: "room" }, { sub: "alice", topics: ["lobby", "room"] }))).toBe("admitted alice to room")
  })

  it("refuses with 1008 a socket without a topic, an unauthenticated one, and one whose token is for other topics", () => {
    const policy = Edge.CloseCode.PolicyViolation
    expect(verdict(open({}, { sub: "alice" }))).toBe(`${policy} topic is required (?topic=)`)
    expect(verdict(open({ topic: "" }, { sub: "alice" }))).toBe(`${policy} topic is required (?topic=)`)
    expect(verdict(open({ topic: "room" }))).toBe(`${policy} authentication required`)
    expect(verdict(open({ topic: "room" }, { sub: "alice", topics: ["lobby"] }))).toBe(`${policy} token is not valid for topic room`)
  })

  it("refuses the gateway's own namespace, and names over the length limit", () => {
    const policy = Edge.CloseCode.PolicyViolation
    expect(verdict(open({ topic: "room" }, { sub: `${Mcpx.RESERVED_PREFIX}gateway` }))).toBe(
      `${policy} participant ids starting with ${Mcpx.RESERVED_PREFIX} are reserved for the gateway`
    )
    const long = "x".repeat(Mcpx.MAX_ID_LENGTH + 1)
    expect(verdict(open({ topic: "room" }, { sub: long }))).toBe(`${policy} participant ids are limited to ${Mcpx.MAX_ID_LENGTH} characters`)
    expect(verdict(open({ topic: "x".repeat(Mcpx.MAX_TOPIC_LENGTH + 1) }, { sub: "alice" }))).toBe(
      `${policy} topic names are limited to ${Mcpx.MAX_TOPIC_LENGTH} characters`
    )
    expect(verdict(open({ topic: "x".repeat(Mcpx.MAX_TOPIC_LENGTH) }, { sub: "x".repeat(Mcpx.MAX_ID_LENGTH) }))).toMatch(/^admitted/)
  })

  it("gives everyone full privilege in an open topic; elsewhere an admin's assignment outlives the socket, else the token says, else restricted", () => {
    expect(privilegeOf("open", saved("restricted", true), "restricted")).toBe("full")
    expect(privilegeOf("mixed", saved("restricted", true), "full")).toBe("restricted")
    expect(privilegeOf("mixed", saved("full", true), "restricted")).toBe("full")
    // A record the token wrote, not an admin: the new token decides.
    expect(privilegeOf("mixed", saved("full"), "restricted")).toBe("restricted")
    expect(privilegeOf("mixed", Option.none(), "full")).toBe("full")
    expect(privilegeOf("mixed", Option.none(), undefined)).toBe("restricted")
  })
})
