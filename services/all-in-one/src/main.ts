/** `npm start`: the whole of Switchboard in one process. */
import { NodeRuntime } from "@effect/platform-node"
import * as Layer from "effect/Layer"
import * as AllInOne from "./AllInOne.ts"

AllInOne.layer.pipe(Layer.launch, NodeRuntime.runMain({ disablePrettyLogger: true }))
