export * as Edge from "./Edge.ts"
export * as EdgeConfig from "./Config.ts"
export * as Routes from "./Routes.ts"
