export * as JsonRpc from "./JsonRpc.ts"
