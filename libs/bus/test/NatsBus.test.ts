import { NatsServer } from "@switchboard/testing"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as NatsBus from "../src/NatsBus.ts"
import { contract } from "./contract.ts"

contract("nats", NatsServer.layer, (namespace) =>
  Layer.unwrapEffect(Effect.map(NatsServer, ({ servers }) => NatsBus.layer({ servers, namespace }))))
