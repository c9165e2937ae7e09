export * as Router from "./Router.ts"
