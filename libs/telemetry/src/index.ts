export * as Logging from "./Logging.ts"
export * as Telemetry from "./Telemetry.ts"
