/**
 * The scale-out topology of issue 18, every process a container of the Switchboard image: 2
 * replicas each of auth, router, broker and registry and 3 edges, on a 3-node NATS cluster with
 * state replicated 3 times. Instances can be killed, stopped and replaced while the test runs; the
 * edges sit in numbered slots so that clients know which edge is their "home" and which is next.
 */
import { NatsCluster, SwitchboardContainer } from "@switchboard/testing"
import type { SwitchboardImage } from "@switchboard/testing"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import * as Scope from "effect/Scope"
import { namespace as freshNamespace, SECRET } from "../src/support/Stack.ts"

export type Service = "auth" | "router" | "broker" | "registry" | "edge"

/** The line each service logs once it serves (see libs/bus Actors.host, AuthService, the edge's server). */
const READY: Record<Service, RegExp> = {
  auth: /auth: answering token verification/,
  router: /router: hosting connection actors/,
  broker: /broker: hosting connection actors/,
  registry: /registry: hosting connection actors/,
  edge: /edge \S+ listening on/
}

export const SERVICES: ReadonlyArray<Exclude<Service, "edge">> = ["auth", "router", "broker", "registry"]
export const EDGES = 3
export const REPLICAS = 2
/** Kubernetes' default termination grace. */
export const GRACE = Duration.seconds(30)

export interface Instance {
  readonly service: Service
  /** `router#3`: the service and the order it was started in, for logs and the report. */
  readonly name: string
  readonly container: SwitchboardContainer.SwitchboardContainer
  /** The edge slot it fills (edges only). */
  readonly slot?: number
  /** The replica id it logged (services that host actors), as KV records name their owner. */
  readonly replica: () => string | undefined
}

export interface Topology {
  readonly namespace: string
  readonly natsServers: ReadonlyArray<string>
  /** The instances of `service` that are in service now, oldest first. */
  readonly live: (service: Service) => ReadonlyArray<Instance>
  /** The ws:// base URL of the edge in `slot`, or undefined while the slot is empty. */
  readonly edgeAt: (slot: number) => string | undefined
  /** Starts one more instance of `service` (an edge fills `slot`) and returns once it serves. */
  readonly start: (service: Service, slot?: number) => Effect.Effect<Instance, SwitchboardContainer.SwitchboardContainerError>
  /**
   * Takes `instance` out of service (an edge leaves its slot first, as a load balancer would drop
   * it), then SIGKILLs it, or with `SIGTERM` stops it as `docker stop`/Kubernetes do.
   */
  readonly stop: (instance: Instance, how: "SIGKILL" | "SIGTERM") => Effect.Effect<SwitchboardContainer.StoppedContainer, SwitchboardContainer.SwitchboardContainerError>
  /** Every instance's output so far, for a failure's diagnosis. */
  readonly logs: () => string
}

/** Starts the whole topology on `cluster` in a fresh namespace; containers live as long as the scope. */
export const topology = (env: Readonly<Record<string, string>> = {}) =>
  Effect.gen(function*() {
    const cluster = yield* NatsCluster
    const scope = yield* Effect.scope
    const namespace = freshNamespace()
    const settings = {
      NATS_URL: cluster.servers.join(","),
      SWITCHBOARD_JWT_SECRET: SECRET,
      SWITCHBOARD_NAMESPACE: namespace,
      SWITCHBOARD_STATE_REPLICAS: "3",
      LOG_LEVEL: "info",
      ...env
    }
    const all: Array<Instance> = []
    const live = new Map<Service, Array<Instance>>()
    const slots: Array<Instance | undefined> = Array.from({ length: EDGES }, () => undefined)
    let started = 0

    const start = (service: Service, slot?: number) =>
      Effect.gen(function*() {
        const container = yield* SwitchboardContainer.start({
          command: ["node", "--enable-source-maps", `services/${service}/dist/main.js`],
          env: service === "edge" ? { ...settings, EDGE_ID: `edge-${slot}-${started}` } : settings,
          ready: READY[service],
          startTimeout: "60 seconds"
        }).pipe(
          Scope.extend(scope),
          // As a restart policy would (compose's `restart`, a Deployment's pods): a service exits when
          // it cannot set up, e.g. while JetStream on a new cluster is not yet available to it.
          Effect.tapError((e) => Effect.logWarning(`${service} exited during start; starting it again`, e)),
          Effect.retry({ schedule: Schedule.spaced("1 second"), times: 3 })
        )
        const instance: Instance = {
          service,
          name: `${service}#${++started}`,
          container,
          ...(slot === undefined ? {} : { slot }),
          replica: () => /hosting connection actors \(replica ([0-9a-f-]+)\)/.exec(container.output())?.[1]
        }
        all.push(instance)
        if (service === "edge" && slot !== undefined) {
          // Listening is not serving: /readyz says the edge's NATS connection is up.
          yield* Effect.tryPromise(() => fetch(`${container.url}/readyz`, { signal: AbortSignal.timeout(2_000) })).pipe(
            Effect.filterOrFail((res) => res.status === 200, () => new Error("not ready")),
            Effect.retry({ schedule: Schedule.spaced("100 millis"), times: 100 }),
            Effect.orDie
          )
          slots[slot] = instance
        }
        live.set(service, [...(live.get(service) ?? []), instance])
        yield* Effect.logInfo(`${instance.name} serves${slot === undefined ? "" : ` in edge slot ${slot}`} on ${container.url}`)
        return instance
      }) as Effect.Effect<Instance, SwitchboardContainer.SwitchboardContainerError, SwitchboardImage>

    const image = yield* Effect.context<SwitchboardImage>()
    const startWithImage = (service: Service, slot?: number) => Effect.provide(start(service, slot), image)

    const stop = (instance: Instance, how: "SIGKILL" | "SIGTERM") =>
      Effect.suspend(() => {
        live.set(instance.service, (live.get(instance.service) ?? []).filter((i) => i !== instance))
        if (instance.slot !== undefined && slots[instance.slot] === instance) slots[instance.slot] = undefined
        return how === "SIGKILL" ? instance.container.kill("SIGKILL") : instance.container.stop(GRACE)
      }).pipe(Effect.tap((stopped) => Effect.logInfo(`${instance.name} ${how}: exit ${stopped.exitCode} after ${Duration.format(stopped.took)}`)))

    yield* Effect.all(
      [
        ...SERVICES.flatMap((service) => Array.from({ length: REPLICAS }, () => startWithImage(service))),
        ...Array.from({ length: EDGES }, (_, slot) => startWithImage("edge", slot))
      ],
      // Two at a time: eleven Node processes starting at once on two shared cores only queue up.
      { concurrency: 2, discard: true }
    )

    return {
      namespace,
      natsServers: cluster.servers,
      live: (service) => live.get(service) ?? [],
      edgeAt: (slot) => slots[slot]?.container.url.replace(/^http/, "ws"),
      start: startWithImage,
      stop,
      logs: () => all.map((i) => `--- ${i.name} ---\n${i.container.output()}`).join("\n")
    } satisfies Topology
  })
