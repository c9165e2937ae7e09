/**
 * Headless Chromium as shared/BROWSER.md describes it: Debian's /usr/bin/chromium driven by
 * playwright-core, a fresh profile directory per launch, and the browser closed and its profile
 * removed when the scope ends, even when the test fails (a leaked Chromium keeps a core busy).
 * A persistent context, since that is the only kind that can load an extension.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { type BrowserContext, chromium } from "playwright-core"

export interface LaunchOptions {
  /** Flags added to the standard ones, e.g. `--load-extension=…` or `--disable-popup-blocking`. */
  readonly args?: ReadonlyArray<string>
}

/** Flags every launch gets: headless without sandbox (we run as root), and nothing phoning home. */
export const standardArgs: ReadonlyArray<string> = [
  "--headless=new",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--no-first-run"
]

/** A browser for as long as the scope lives. */
export const launch = (options: LaunchOptions = {}) =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const profile = await mkdtemp(join(tmpdir(), "sb-chromium-"))
      try {
        const context = await chromium.launchPersistentContext(profile, {
          executablePath: "/usr/bin/chromium",
          headless: true,
          args: [...standardArgs, ...(options.args ?? [])]
        })
        return { context, profile }
      } catch (error) {
        await rm(profile, { recursive: true, force: true })
        throw error
      }
    }),
    ({ context, profile }) =>
      Effect.promise(async () => {
        await context.close().catch(() => undefined)
        await rm(profile, { recursive: true, force: true })
      })
  ).pipe(Effect.map(({ context }): BrowserContext => context))

/** One browser per test file: provide this layer to the file's tests. */
export class Chromium extends Context.Tag("@switchboard/test/Chromium")<Chromium, BrowserContext>() {}

export const layer = (options: LaunchOptions = {}) => Layer.scoped(Chromium, launch(options))
