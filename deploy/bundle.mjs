// Bundles the current package's src/main.ts into dist/main.js, a single file that runs on plain
// Node with no node_modules: what the container image ships. Run by each deployable's `build`.
import { build } from "esbuild"

await build({
  entryPoints: ["src/main.ts"],
  outfile: "dist/main.js",
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
