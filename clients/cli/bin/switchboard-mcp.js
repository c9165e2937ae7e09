#!/usr/bin/env node
// The `switchboard-mcp` command: runs the TypeScript source under tsx, as every internal package
// here runs (no build step). Only the bridge writes to stdout; tsx itself prints nothing.
import { fileURLToPath } from "node:url"
import { register } from "tsx/esm/api"

register({ tsconfig: fileURLToPath(new URL("../tsconfig.json", import.meta.url)) })
await import("../src/main.ts")
