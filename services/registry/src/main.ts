/** The MCP-B tool registry as its own process (needs NATS_URL). */
import { Process } from "@switchboard/auth"
import * as Registry from "./Registry.ts"

Process.run("registry", Registry.layer)
