export * as AllInOne from "./AllInOne.ts"
