// Bundles one entry point into a single file that runs on plain Node with no node_modules: what
// the container image ships. Each deployable's `build` runs it with the defaults (src/main.ts into
// dist/main.js); the benchmark bundles what it measures the same way.
// Usage: node deploy/bundle.mjs [entry = src/main.ts] [outfile = dist/main.js]
import { build } from "esbuild"

const [entry = "src/main.ts", outfile = "dist/main.js"] = process.argv.slice(2)

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
