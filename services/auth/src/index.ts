export * as AuthClient from "./AuthClient.ts"
export * as AuthService from "./AuthService.ts"
export * as Tokens from "./Tokens.ts"
