/** The auth service as its own process: answers `auth.verify` on NATS. */
import * as Layer from "effect/Layer"
import * as AuthService from "./AuthService.ts"
import * as Process from "./Process.ts"
import * as Tokens from "./Tokens.ts"

Process.runOnBus("auth", AuthService.layer.pipe(Layer.provide(Tokens.layer)))
