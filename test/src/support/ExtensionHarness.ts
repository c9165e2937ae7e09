/**
 * The project's extension in real headless Chromium, as the browser tests use it: built afresh,
 * loaded unpacked, its service worker at hand, pointed at a Switchboard as a user would point it.
 */
import { buildExtension } from "@switchboard/extension/build"
import { Keys } from "@switchboard/extension/keys"
import * as Effect from "effect/Effect"
import { mkdtemp, rm } from "node:fs/promises"
import { createServer } from "node:http"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { BrowserContext, Worker } from "playwright-core"
import { launch } from "./Browser.ts"
import type { TestClient } from "./Client.ts"
import { call } from "./ProxyPeers.ts"
import { token } from "./Stack.ts"

/** A fresh temporary directory, removed with the scope. */
export const tempDir = (prefix: string) =>
  Effect.acquireRelease(
    Effect.promise(() => mkdtemp(join(tmpdir(), prefix))),
    (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
  )

/** Serves `pages` (path → HTML or script) on `host` at a free port for as long as the scope lives; its base URL. */
export const pageServer = (pages: Readonly<Record<string, string>>, host = "127.0.0.1") =>
  Effect.acquireRelease(
    Effect.async<{ readonly url: string; readonly close: () => void }>((resume) => {
      const server = createServer((req, res) => {
        const path = new URL(req.url ?? "/", "http://x").pathname
        const body = pages[path]
        if (body === undefined) return void res.writeHead(404).end("not found")
        const type = path.endsWith(".js") ? "text/javascript" : "text/html; charset=utf-8"
        res.writeHead(200, { "content-type": type, "cache-control": "no-store" }).end(body)
      })
      server.listen(0, host, () => {
        const address = server.address()
        resume(Effect.succeed({ url: `http://${host}:${typeof address === "object" && address !== null ? address.port : 0}`, close: () => server.close() }))
      })
    }),
    (s) => Effect.sync(() => s.close())
  ).pipe(Effect.map((s) => s.url))

/** The extension's service worker, started with the browser, and the extension's id. */
export const serviceWorker = (context: BrowserContext) =>
  Effect.promise(async () => {
    const worker = context.serviceWorkers()[0] ?? (await context.waitForEvent("serviceworker", { timeout: 10_000 }))
    return { worker, extensionId: new URL(worker.url()).host }
  })

/** Chromium with the extension built afresh and loaded unpacked; closed with the scope. */
export const withExtension = Effect.gen(function*() {
  const dir = yield* tempDir("sb-extension-")
  yield* Effect.promise(() => buildExtension(dir))
  const context = yield* launch({ args: [`--disable-extensions-except=${dir}`, `--load-extension=${dir}`] })
  return { context, ...(yield* serviceWorker(context)) }
})

interface StorageGlobals {
  readonly chrome: { readonly storage: { readonly local: { set(items: Record<string, string>): Promise<void> } } }
}

/** Writes `items` into the extension's `chrome.storage.local`, from its service worker, as a harness or policy would. */
export const setStorage = (worker: Worker, items: Record<string, string>) =>
  Effect.promise(() => worker.evaluate((i) => (globalThis as unknown as StorageGlobals).chrome.storage.local.set(i), items))

/** Points the extension at `ws` as `user`: it connects as soon as both keys are set. */
export const configure = (worker: Worker, ws: string, user: string) =>
  Effect.flatMap(token({ sub: user }), (t) => setStorage(worker, { [Keys.serverUrl]: ws.replace("ws://", "http://"), [Keys.token]: t }))

/** The extensions the proxy lists for `mcp`'s user, once `ok` holds of them (polled for up to `seconds`: nothing announces it). */
export const extensionsUntil = (mcp: TestClient, ok: (list: ReadonlyArray<{ id: string; name: string }>) => boolean, seconds = 15) =>
  Effect.gen(function*() {
    for (let i = 0; ; i++) {
      const answer = yield* call(mcp, `list-${i}`, "list_extensions")
      const list = (answer.result as { extensions: Array<{ id: string; name: string }> }).extensions
      if (ok(list)) return list
      if (i > seconds * 10) return yield* Effect.dieMessage(`list_extensions never matched; last: ${JSON.stringify(list)}`)
      yield* Effect.sleep("100 millis")
    }
  })

/** The width and height of a PNG, or undefined when `bytes` is none. */
export const pngSize = (bytes: Buffer) =>
  bytes.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])) && bytes.subarray(12, 16).toString() === "IHDR"
    ? { width: bytes.readUInt32BE(16), height: bytes.readUInt32BE(20) }
    : undefined

interface DebuggerGlobals {
  readonly chrome: {
    readonly debugger: {
      getTargets(): Promise<Array<{ readonly id: string; readonly url: string; readonly tabId?: number }>>
      attach(target: { readonly tabId: number }, version: string): Promise<void>
      detach(target: { readonly tabId: number }): Promise<void>
    }
  }
}

/**
 * Whether the extension holds the debugger of the tab of target `which` (by its id, or by the url
 * it shows): an extension cannot attach twice, so an attach from its worker fails while it does
 * (and is undone at once when it succeeds). Other debuggers (a test's own Playwright) do not
 * count. `undefined` when no tab matches.
 */
export const extensionAttached = (worker: Worker, which: { readonly id: string } | { readonly url: string }) =>
  Effect.promise(() =>
    worker.evaluate(async (target) => {
      const { debugger: d } = (globalThis as unknown as DebuggerGlobals).chrome
      const tabId = (await d.getTargets()).find((t) => ("id" in target ? t.id === target.id : t.url === target.url))?.tabId
      if (tabId === undefined) return undefined
      try {
        await d.attach({ tabId }, "1.3")
      } catch {
        return true
      }
      await d.detach({ tabId })
      return false
    }, which)
  )
