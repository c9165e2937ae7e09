export * as Broker from "./Broker.ts"
