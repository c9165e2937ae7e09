/** The session router as its own process (needs NATS_URL). */
import { AuthClient } from "@switchboard/auth"
import { Process } from "@switchboard/bus"
import * as Layer from "effect/Layer"
import * as Router from "./Router.ts"

Process.run("router", Router.layer.pipe(Layer.provide(AuthClient.layer)))
