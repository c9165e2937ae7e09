/** The MCP-B tool registry as its own process (needs NATS_URL). */
import { AuthClient } from "@switchboard/auth"
import { Process } from "@switchboard/bus"
import * as Layer from "effect/Layer"
import * as Registry from "./Registry.ts"

Process.run("registry", Registry.layer.pipe(Layer.provide(AuthClient.layer)))
