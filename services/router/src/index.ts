export * as InternalClient from "./InternalClient.ts"
export * as Router from "./Router.ts"
