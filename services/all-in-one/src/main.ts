/** `npm start`: the whole of Switchboard in one process. */
import { NodeRuntime } from "@effect/platform-node"
import * as AllInOne from "./AllInOne.ts"

AllInOne.main.pipe(NodeRuntime.runMain({ disablePrettyLogger: true }))
