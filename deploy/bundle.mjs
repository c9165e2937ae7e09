// Bundles entry points into single files that run on plain Node with no node_modules: what the
// container image ships. Each deployable's `build` runs it with the defaults: src/main.ts into
// dist/main.js, and src/cli.ts into dist/cli.js where a deployable has a command line (auth's
// `token`, which the image runs as `docker run <image> token --sub alice`). The benchmark bundles
// what it measures the same way, naming the entry; the tests bundle every service in one call.
// Usage: node deploy/bundle.mjs [entry outfile]...   (paths relative to the working directory)
import { build } from "esbuild"
import { existsSync, readFileSync, writeFileSync } from "node:fs"
import { dirname, relative, resolve, sep } from "node:path"
import { keepMappings, ownSource } from "./sourceMaps.mjs"

const args = process.argv.slice(2)
if (args.length % 2 !== 0) {
  console.error("usage: node deploy/bundle.mjs [entry outfile]...")
  process.exit(2)
}
const pairs = args.length > 0
  ? args.flatMap((entry, i) => (i % 2 === 0 ? [{ entry, outfile: args[i + 1] }] : []))
  : [{ entry: "src/main.ts", outfile: "dist/main.js" }, { entry: "src/cli.ts", outfile: "dist/cli.js" }].filter(({ entry }) => existsSync(entry))

// One build for every pair: esbuild parses the modules they share once. Without `splitting`
// each output still holds all it needs. Outputs are named under one folder that holds them all.
const outfiles = pairs.map(({ outfile }) => resolve(outfile))
let outdir = dirname(outfiles[0])
while (!outfiles.every((f) => f.startsWith(outdir + sep))) outdir = dirname(outdir)
await build({
  entryPoints: pairs.map(({ entry }, i) => ({ in: entry, out: relative(outdir, outfiles[i]).replace(/\.js$/, "") })),
  outdir,
  bundle: true,
  platform: "node",
  target: "node20",
  format: "esm",
  sourcemap: true,
  // ws works without its optional native speed-ups.
  external: ["bufferutil", "utf-8-validate"],
  // Some dependencies are CommonJS and call require(); give the ESM bundle one.
  banner: { js: "import { createRequire as __createRequire } from 'node:module'; const require = __createRequire(import.meta.url);" },
  logLevel: "warning"
})
// Only the project's own code keeps its mappings (see sourceMaps.mjs).
for (const outfile of outfiles) {
  const map = `${outfile}.map`
  writeFileSync(map, JSON.stringify(keepMappings(JSON.parse(readFileSync(map, "utf8")), ownSource)))
}
