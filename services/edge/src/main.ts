/** One edge as its own process (needs NATS_URL); run as many as the load needs. */
import { Process } from "@switchboard/auth"
import * as Edge from "./Edge.ts"

Process.run("edge", Edge.layer())
