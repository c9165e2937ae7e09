/**
 * Bundles the library for a plain <script>: dist/postmessage.js defines the global
 * `SwitchboardPostMessage`. Bundlers import src/ directly (package.json `exports`); tests call
 * `buildScript` to bundle into a directory of their own.
 * Usage: tsx build.ts [outfile = dist/postmessage.js]
 */
import { build } from "esbuild"
import { fileURLToPath } from "node:url"

export const GLOBAL_NAME = "SwitchboardPostMessage"

export const buildScript = async (outfile: string): Promise<void> => {
  await build({
    entryPoints: [fileURLToPath(new URL("src/index.ts", import.meta.url))],
    outfile,
    bundle: true,
    platform: "browser",
    target: "es2022",
    format: "iife",
    globalName: GLOBAL_NAME,
    sourcemap: true,
    minify: true,
    logLevel: "warning"
  })
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  await buildScript(process.argv[2] ?? fileURLToPath(new URL("dist/postmessage.js", import.meta.url)))
}
