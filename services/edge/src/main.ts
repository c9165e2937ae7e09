/** One edge as its own process (needs NATS_URL); run as many as the load needs. */
import { AuthClient } from "@switchboard/auth"
import { Process } from "@switchboard/bus"
import * as Layer from "effect/Layer"
import * as Edge from "./Edge.ts"

Process.run("edge", Edge.layer().pipe(Layer.provide(AuthClient.layer)))
