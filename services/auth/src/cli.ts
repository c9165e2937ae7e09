/**
 * `npm run token -- --sub alice [--ttl 1h] [--privilege full|restricted] [--topics a,b] [--admin]`
 * prints a development token signed with SWITCHBOARD_JWT_SECRET.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { parseArgs } from "node:util"
import * as Tokens from "./Tokens.ts"

const usage = `Usage: npm run token -- --sub <user> [options]

Prints a development JWT signed (HS256) with SWITCHBOARD_JWT_SECRET.

Options:
  --sub <id>                    user id (the token's sub claim), required
  --ttl <duration>              lifetime, e.g. 30s, 15m, 1h, 7d (default 1h)
  --privilege full|restricted   MCPx privilege claim
  --topics a,b                  MCPx topics the token may join
  --admin                       MCPx admin claim (may promote participants)
  -h, --help                    show this help
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

const { values } = (() => {
  try {
    return parseArgs({
      options: {
        sub: { type: "string" },
        ttl: { type: "string", default: "1h" },
        privilege: { type: "string" },
        topics: { type: "string" },
        admin: { type: "boolean", default: false },
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
const sub = values.sub ?? fail("--sub is required")
const ttl = Option.getOrElse(parseTtl(values.ttl), () => fail(`--ttl ${values.ttl} is not a duration like 30s, 15m, 1h or 7d`))
const privilege = values.privilege
if (privilege !== undefined && privilege !== "full" && privilege !== "restricted") fail("--privilege is full or restricted")
if (process.env["SWITCHBOARD_JWT_SECRET"] === undefined) {
  fail("SWITCHBOARD_JWT_SECRET is not set: use the same secret the server runs with")
}

const program = Effect.gen(function*() {
  const tokens = yield* Tokens.Tokens
  return yield* tokens.issue({
    sub,
    ttl,
    ...(privilege === "full" || privilege === "restricted" ? { privilege } : {}),
    ...(values.topics === undefined ? {} : { topics: values.topics.split(",").map((t) => t.trim()).filter((t) => t.length > 0) }),
    ...(values.admin ? { admin: true } : {})
  })
}).pipe(Effect.provide(Tokens.layer))

Effect.runPromise(program).then(
  (token) => process.stdout.write(`${token}\n`),
  (e: unknown) => fail(e instanceof Error ? e.message : String(e))
)
