/**
 * `switchboard-mcp`: parses the command line, then serves the bridge on stdio until the host goes
 * away (stdin ends) or a signal arrives. Usage errors exit 2; nothing but MCP is written to stdout.
 */
import { readFileSync } from "node:fs"
import * as Log from "./Log.ts"
import { parse, usage } from "./Options.ts"

const version = (JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { version: string }).version
const log = Log.stderr()
const parsed = parse(process.argv.slice(2), process.env)

switch (parsed._tag) {
  case "Help":
    process.stdout.write(usage)
    break
  case "Version":
    process.stdout.write(`switchboard-mcp ${version}\n`)
    break
  case "Invalid":
    process.stderr.write(`switchboard-mcp: ${parsed.message}\nRun switchboard-mcp --help for the options.\n`)
    process.exitCode = 2
    break
  case "Run": {
    const { options } = parsed
    // Both MCP SDKs take a while to load; --help and --version, and hosts that run them to check a
    // configuration, need neither.
    const [{ Bridge }, { StdioServerTransport }] = await Promise.all([import("./Bridge.ts"), import("@modelcontextprotocol/server/stdio")])
    const bridge = new Bridge(options, log, version)
    let stopping = false
    const stop = (why: string) => {
      if (stopping) return
      stopping = true
      log.info(`${why}; stopping`)
      // Closing the sockets politely can wait on a peer that is gone; the exit does not.
      setTimeout(() => process.exit(0), 2_000).unref()
      bridge.stop().then(
        () => process.exit(0),
        () => process.exit(0)
      )
    }
    process.stdin.once("end", () => stop("the host closed stdin"))
    process.stdin.once("close", () => stop("the host closed stdin"))
    process.once("SIGTERM", () => stop("SIGTERM"))
    process.once("SIGINT", () => stop("SIGINT"))
    // The host went away mid-write: nothing left to serve.
    process.stdout.on("error", (e) => stop(`stdout failed (${e.message})`))
    // A bug in a callback must not take the host's tools down with it; it is logged instead.
    process.on("uncaughtException", (e) => log.error(`uncaught: ${e.stack ?? e.message}`))
    process.on("unhandledRejection", (e) => log.error(`unhandled rejection: ${Log.describe(e)}`))
    log.info(`switchboard-mcp ${version}: ${options.url}${options.browser ? "" : " (hub tools only)"}`)
    bridge.serve(new StdioServerTransport())
    break
  }
}
