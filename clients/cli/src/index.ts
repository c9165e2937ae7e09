// switchboard-mcp as a library: the bridge and its parts, for tests and for embedding.
export * as BrowserTools from "./BrowserTools.ts"
export { Bridge } from "./Bridge.ts"
export * as Options from "./Options.ts"
