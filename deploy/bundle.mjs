// Bundles an entry point into a single file that runs on plain Node with no node_modules: what
// the container image ships. Each deployable's `build` runs it with the defaults: src/main.ts into
// dist/main.js, and src/cli.ts into dist/cli.js where a deployable has a command line (auth's
// `token`, which the image runs as `docker run <image> token --sub alice`). The benchmark bundles
// what it measures the same way, naming the entry.
// Usage: node deploy/bundle.mjs [entry = src/main.ts] [outfile = dist/main.js]
import { build } from "esbuild"
import { existsSync } from "node:fs"

const args = process.argv.slice(2)
const entries = args.length > 0
  ? [{ entry: args[0], outfile: args[1] ?? "dist/main.js" }]
  : [{ entry: "src/main.ts", outfile: "dist/main.js" }, { entry: "src/cli.ts", outfile: "dist/cli.js" }].filter(({ entry }) => existsSync(entry))

for (const { entry, outfile } of entries) {
  await build({
    entryPoints: [entry],
    outfile,
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
}
