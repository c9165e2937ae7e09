import * as Layer from "effect/Layer"
import * as MemoryBus from "../src/MemoryBus.ts"
import { contract } from "./contract.ts"

contract("embedded", Layer.empty, () => MemoryBus.layer)
