/** What every bench server shares: how it says it listens, and its WebSocket servers' options. */

/** The line the bench waits for (processes.ts): `READY <port>`. */
export const ready = (port: number) => process.stdout.write(`READY ${port}\n`)

export const wsOptions = { port: 0, host: "127.0.0.1", perMessageDeflate: false, maxPayload: 1024 * 1024 } as const
