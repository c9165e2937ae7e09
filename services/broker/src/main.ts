/** The MCPx topic broker as its own process (needs NATS_URL). */
import { Process } from "@switchboard/auth"
import * as Broker from "./Broker.ts"

Process.run("broker", Broker.layer)
