/** The MCPx topic broker as its own process (needs NATS_URL). */
import { AuthClient } from "@switchboard/auth"
import { Process } from "@switchboard/bus"
import * as Layer from "effect/Layer"
import * as Broker from "./Broker.ts"

Process.run("broker", Broker.layer.pipe(Layer.provide(AuthClient.layer)))
