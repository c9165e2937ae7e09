/** The session router as its own process (needs NATS_URL). */
import { Process } from "@switchboard/auth"
import * as Router from "./Router.ts"

Process.run("router", Router.layer)
