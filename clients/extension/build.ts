/**
 * Builds the unpacked extension: the four entry points bundled by esbuild (no runtime
 * dependencies, one classic script each), plus manifest.json, popup.html and the policy schema.
 * `npm run build` writes dist/; tests call `buildExtension` with a folder of their own.
 */
import { build } from "esbuild"
import { cp, mkdir } from "node:fs/promises"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

const root = dirname(fileURLToPath(import.meta.url))

export const defaultOutdir = join(root, "dist")

const entries = ["sw", "content", "page-world", "popup"] as const

/** Builds the extension into `outdir` (created if missing) and returns it. */
export const buildExtension = async (outdir: string = defaultOutdir): Promise<string> => {
  await mkdir(outdir, { recursive: true })
  await build({
    entryPoints: Object.fromEntries(entries.map((e) => [e, join(root, "src", `${e}.ts`)])),
    outdir,
    bundle: true,
    format: "iife",
    platform: "browser",
    target: "chrome116",
    sourcemap: "linked",
    logLevel: "warning"
  })
  await cp(join(root, "static"), outdir, { recursive: true })
  return outdir
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  console.log(`built ${await buildExtension()}`)
}
