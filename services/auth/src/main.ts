/** The auth service as its own process: answers `auth.verify` on NATS. */
import { Process } from "@switchboard/bus"
import * as Layer from "effect/Layer"
import * as AuthService from "./AuthService.ts"
import * as Tokens from "./Tokens.ts"

Process.run("auth", AuthService.layer.pipe(Layer.provide(Tokens.layer)))
