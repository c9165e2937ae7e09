export * as Broker from "./Broker.ts"
export * as BrokerConfig from "./Config.ts"
