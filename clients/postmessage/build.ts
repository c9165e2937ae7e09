/**
 * Bundles the library for a plain <script>: dist/postmessage.js defines the global
 * `SwitchboardPostMessage`; and dist/embed.js, the script of the edge's `/embed` page. Bundlers
 * import src/ directly (package.json `exports`); tests call these to bundle into a directory of
 * their own.
 * Usage: tsx build.ts [outdir = dist]
 */
import { build } from "esbuild"
import { fileURLToPath } from "node:url"

export const GLOBAL_NAME = "SwitchboardPostMessage"

const bundle = (entry: string, outfile: string, globalName?: string) =>
  build({
    entryPoints: [fileURLToPath(new URL(entry, import.meta.url))],
    outfile,
    bundle: true,
    platform: "browser",
    target: "es2022",
    format: "iife",
    ...(globalName === undefined ? {} : { globalName }),
    sourcemap: true,
    minify: true,
    logLevel: "warning"
  })

/** The library as a plain script defining `SwitchboardPostMessage`. */
export const buildScript = async (outfile: string): Promise<void> => {
  await bundle("src/index.ts", outfile, GLOBAL_NAME)
}

/** The script of the edge's `/embed` page. */
export const buildEmbedScript = async (outfile: string): Promise<void> => {
  await bundle("src/embed/EmbedPage.ts", outfile)
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const outdir = process.argv[2] ?? fileURLToPath(new URL("dist", import.meta.url))
  await Promise.all([buildScript(`${outdir}/postmessage.js`), buildEmbedScript(`${outdir}/embed.js`)])
}
