/**
 * `npm run token -- --sub alice [--ttl 1h] [--privilege full|restricted] [--topics a,b] [--admin]
 * [--claim key=value]...` prints a development token signed with SWITCHBOARD_JWT_SECRET.
 */
import { Json } from "@switchboard/protocol"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import { parseArgs } from "node:util"
import * as Tokens from "./Tokens.ts"

const usage = `Usage: npm run token -- --sub <user> [options]

Prints a development JWT signed (HS256) with SWITCHBOARD_JWT_SECRET.

Options:
  --sub <id>                    user id (the token's sub claim); may be left out when a
                                --claim names the user instead: user_id=<id>, or the
                                claim SWITCHBOARD_JWT_USER_CLAIM names
  --ttl <duration>              lifetime, e.g. 30s, 15m, 1h, 7d (default 1h, or
                                SWITCHBOARD_JWT_MAX_LIFETIME if that is shorter; a
                                longer --ttl than that is refused)
  --privilege full|restricted   MCPx privilege claim
  --topics a,b                  MCPx topics the token may join
  --admin                       MCPx admin claim (may promote participants)
  --claim <key>=<value>         any further claim; repeatable. A value that parses as JSON
                                (3, true, {"a":1}) is that JSON, anything else is a string;
                                quote to force a string: --claim 'user_id="42"'.
                                sub, exp, iat, nbf, iss and aud are reserved.
  -h, --help                    show this help

A Blueprint MCP client enters proxy mode only when its token carries connection_url:
  npm run token -- --sub alice --claim connection_url=wss://switchboard.example/mcp
`

const parseTtl = (s: string): Option.Option<Duration.Duration> => {
  const m = /^(\d+)\s*(s|m|h|d)$/.exec(s.trim())
  if (m === null) return Option.none()
  const unit = { s: "seconds", m: "minutes", h: "hours", d: "days" } as const
  return Option.some(Duration.decode(`${Number(m[1])} ${unit[m[2] as keyof typeof unit]}`))
}

const fail = (message: string): never => {
  process.stderr.write(`token: ${message}\n\n${usage}`)
  process.exit(2)
}

/** A claim's value: JSON when it parses as JSON (`42`, `["a"]`), else the text as given. */
const claimValue = (raw: string): unknown => Either.getOrElse(Json.parse(raw), () => raw)

/** `--claim key=value` options as one record; the reserved claims are for the other options to set. */
const parseClaims = (specs: ReadonlyArray<string>): Record<string, unknown> => {
  const claims: Record<string, unknown> = {}
  for (const spec of specs) {
    const eq = spec.indexOf("=")
    const key = eq < 0 ? "" : spec.slice(0, eq).trim()
    if (key.length === 0) fail(`--claim ${spec} is not key=value`)
    if (Tokens.reservedClaims.has(key)) {
      fail(`--claim cannot set ${key}: sub, exp, iat, nbf, iss and aud are reserved (use --sub and --ttl)`)
    }
    if (Object.hasOwn(claims, key)) fail(`--claim ${key} is given twice`)
    claims[key] = claimValue(spec.slice(eq + 1))
  }
  return claims
}

const { values } = (() => {
  try {
    return parseArgs({
      options: {
        sub: { type: "string" },
        ttl: { type: "string" },
        privilege: { type: "string" },
        topics: { type: "string" },
        admin: { type: "boolean", default: false },
        claim: { type: "string", multiple: true, default: [] },
        help: { type: "boolean", short: "h", default: false }
      }
    })
  } catch (e) {
    return fail(e instanceof Error ? e.message : String(e))
  }
})()

if (values.help) {
  process.stdout.write(usage)
  process.exit(0)
}
const claims = parseClaims(values.claim)
// Without --sub, issuing refuses a token in which no claim names the user, exactly as verifying would.
const sub = values.sub
const ttl = values.ttl === undefined
  ? undefined
  : Option.getOrElse(parseTtl(values.ttl), () => fail(`--ttl ${values.ttl} is not a duration like 30s, 15m, 1h or 7d`))
const privilege = values.privilege
if (privilege !== undefined && privilege !== "full" && privilege !== "restricted") fail("--privilege is full or restricted")
if (process.env["SWITCHBOARD_JWT_SECRET"] === undefined) {
  fail("SWITCHBOARD_JWT_SECRET is not set: use the same secret the server runs with")
}

const program = Effect.gen(function*() {
  const tokens = yield* Tokens.Tokens
  return yield* tokens.issue({
    ...(sub === undefined ? {} : { sub }),
    ...(ttl === undefined ? {} : { ttl }),
    ...(privilege === "full" || privilege === "restricted" ? { privilege } : {}),
    ...(values.topics === undefined ? {} : { topics: values.topics.split(",").map((t) => t.trim()).filter((t) => t.length > 0) }),
    ...(values.admin ? { admin: true } : {}),
    claims
  })
}).pipe(Effect.provide(Tokens.layer))

Effect.runPromise(program).then(
  (token) => process.stdout.write(`${token}\n`),
  (e: unknown) => fail(e instanceof Error ? e.message : String(e))
)
