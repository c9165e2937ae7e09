export * as Auth from "./Auth.ts"
export * as Edge from "./Edge.ts"
export * as JsonRpc from "./JsonRpc.ts"
export * as Proxy from "./Proxy.ts"
