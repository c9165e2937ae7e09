export * as Naming from "./Naming.ts"
export * as Registry from "./Registry.ts"
