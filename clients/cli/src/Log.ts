/**
 * Every line the bridge prints goes to stderr: stdout belongs to the MCP host. Hosts show stderr in
 * their MCP logs (Claude Desktop: mcp-server-<name>.log).
 */
export type Level = "info" | "warn" | "error"

export interface Log {
  readonly info: (message: string) => void
  readonly warn: (message: string) => void
  readonly error: (message: string) => void
}

export const stderr = (write: (line: string) => void = (line) => void process.stderr.write(line)): Log => {
  const at = (level: Level) => (message: string) => write(`${new Date().toISOString()} switchboard-mcp ${level}: ${message}\n`)
  return { info: at("info"), warn: at("warn"), error: at("error") }
}

/** A reason for a log line, from whatever was thrown. */
export const describe = (e: unknown): string => (e instanceof Error ? e.message : String(e))
