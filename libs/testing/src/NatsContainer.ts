// Real NATS for tests as scoped layers: one JetStream server, or a 3-node JetStream cluster whose
// nodes a test can kill and restart. Containers use host networking and listen on 127.0.0.1 only
// (NatsContainer with host networking hangs, and published ports would bind 0.0.0.0).
import { jetstreamManager } from "@nats-io/jetstream";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { Context, Data, Effect, Exit, Layer, Schedule, Scope } from "effect";
import { GenericContainer, getContainerRuntimeClient, type StartedTestContainer, Wait } from "testcontainers";
import { ensureDocker, ensureNatsImage, ownerLabel } from "./Docker.ts";
import { freePorts as allocatePorts } from "./FreePorts.ts";

export class NatsContainerError extends Data.TaggedError("NatsContainerError")<{
  readonly reason: "DockerUnavailable" | "ContainerStart" | "ClusterNotReady";
  readonly cause: unknown;
}> {
  override get message(): string {
    return `${this.reason}: ${this.cause instanceof Error ? this.cause.message : String(this.cause)}`;
  }
}

const poll = Schedule.spaced("100 millis").pipe(Schedule.upTo("30 seconds"));

const dockerAndImage = Effect.tryPromise({
  try: async () => {
    await ensureDocker();
    return ensureNatsImage();
  },
  catch: (cause) => new NatsContainerError({ reason: "DockerUnavailable", cause })
});

const freePorts = (count: number) =>
  Effect.tryPromise({
    try: () => allocatePorts(count),
    catch: (cause) => new NatsContainerError({ reason: "ContainerStart", cause })
  });

const startNode = (image: string, command: ReadonlyArray<string>, environment: Record<string, string> = {}) =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () =>
        new GenericContainer(image)
          .withLabels({ [ownerLabel]: String(process.pid) })
          .withNetworkMode("host")
          .withEnvironment(environment)
          .withCommand([...command])
          .withWaitStrategy(Wait.forLogMessage("Server is ready"))
          .withStartupTimeout(30_000)
          .start(),
      catch: (cause) => new NatsContainerError({ reason: "ContainerStart", cause })
    }),
    (container) => Effect.tryPromise(() => container.stop()).pipe(Effect.ignoreLogged)
  );

const connection = (servers: ReadonlyArray<string>) =>
  Effect.acquireRelease(
    Effect.tryPromise(() => connect({ servers: [...servers], reconnect: false, timeout: 1_000 })),
    (nc: NatsConnection) => Effect.promise(() => nc.close())
  );

const url = (port: number) => `nats://127.0.0.1:${port}`;

export interface NatsServerOptions {
  /**
   * The cores the Go runtime may run on (GOMAXPROCS); all of the machine's when absent. A server
   * that shares a small machine with busy processes should get its share: with more Ps than it
   * can keep busy, Go's scheduler spins looking for work on every wakeup, and takes that CPU from
   * the others.
   */
  readonly cpus?: number;
}

export class NatsServer extends Context.Tag("@switchboard/testing/NatsServer")<
  NatsServer,
  { readonly servers: ReadonlyArray<string>; readonly url: string }
>() {
  /** One JetStream server, stopped when the layer's scope closes. */
  static readonly layerWith = (options: NatsServerOptions) => Layer.scoped(
    NatsServer,
    Effect.gen(function* () {
      const image = yield* dockerAndImage;
      // Another process may take the probed port before nats-server binds it: try fresh ports.
      const port = yield* Effect.gen(function* () {
        const [port = 0] = yield* freePorts(1);
        yield* startNode(
          image,
          ["-js", "-a", "127.0.0.1", "-p", String(port), "-sd", "/data"],
          options.cpus === undefined ? {} : { GOMAXPROCS: String(options.cpus) }
        );
        return port;
      }).pipe(Effect.retry({ times: 2 }));
      yield* Effect.logInfo(`NATS server ready on ${url(port)}`);
      return { servers: [url(port)], url: url(port) };
    }).pipe(Effect.withLogSpan("NatsServer.layer"))
  );

  static readonly layer = NatsServer.layerWith({});
}

const awaitMetaLeader = (servers: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    const nc = yield* connection(servers).pipe(Effect.retry(poll));
    const jsm = yield* Effect.tryPromise(() => jetstreamManager(nc, { checkAPI: false, timeout: 1_000 }));
    // Fails with "JetStream system temporarily unavailable" until the meta group has elected a leader.
    yield* Effect.tryPromise(() => jsm.getAccountInfo()).pipe(Effect.retry(poll));
  }).pipe(
    Effect.scoped,
    Effect.mapError((cause) => new NatsContainerError({ reason: "ClusterNotReady", cause }))
  );

export class NatsCluster extends Context.Tag("@switchboard/testing/NatsCluster")<
  NatsCluster,
  {
    /** Client URLs of nodes n0, n1, n2. */
    readonly servers: ReadonlyArray<string>;
    /** SIGKILLs node i and returns once it has exited. */
    readonly kill: (i: number) => Effect.Effect<void>;
    /** Starts node i again (same ports, same data) and returns once a client can connect to it. */
    readonly restart: (i: number) => Effect.Effect<void>;
  }
>() {
  /** Three JetStream nodes, ready once the JetStream meta leader exists. */
  static readonly layer = Layer.scoped(
    NatsCluster,
    Effect.gen(function* () {
      const image = yield* dockerAndImage;
      const ports = yield* freePorts(6);
      const clientPorts = ports.slice(0, 3);
      const routes = ports.slice(3).map(url);
      const servers = clientPorts.map(url);
      const nodes = yield* Effect.forEach(
        clientPorts,
        (port, i) =>
          startNode(image, [
            "-js", "--server_name", `n${i}`, "-sd", "/data", "-a", "127.0.0.1", "-p", String(port),
            "--cluster_name", "tc", "--cluster", routes[i] ?? "",
            "--routes", routes.filter((_, j) => j !== i).join(",")
          ]).pipe(Effect.tap(() => Effect.logDebug(`node n${i} is up on ${url(port)}`))),
        { concurrency: "unbounded" }
      );
      yield* awaitMetaLeader(servers);
      yield* Effect.logInfo(`NATS cluster ready on ${servers.join(",")}`);

      const runtime = yield* Effect.promise(() => getContainerRuntimeClient());
      const node = (i: number) => {
        const started: StartedTestContainer | undefined = nodes[i];
        const server = servers[i];
        return started === undefined || server === undefined
          ? Effect.dieMessage(`NatsCluster has no node ${i}`)
          : Effect.succeed({ container: runtime.container.getById(started.getId()), server });
      };

      // Through the runtime client rather than stop()/restart(): those leak the container and
      // restart()'s log wait is flaky (see shared/TESTCONTAINERS.md).
      const kill = Effect.fn("NatsCluster.kill")(function* (i: number) {
        const { container } = yield* node(i);
        yield* Effect.promise(async () => {
          await container.kill({ signal: "SIGKILL" });
          await container.wait();
        });
        yield* Effect.logInfo(`killed node n${i}`);
      });
      const restart = Effect.fn("NatsCluster.restart")(function* (i: number) {
        const { container, server } = yield* node(i);
        yield* Effect.promise(() => runtime.container.start(container));
        yield* Effect.scoped(connection([server])).pipe(Effect.retry(poll), Effect.orDie);
        yield* Effect.logInfo(`restarted node n${i}`);
      });
      return { servers, kill, restart };
    }).pipe(Effect.withLogSpan("NatsCluster.layer"))
  );
}

/**
 * One server that starts without JetStream, as a server does whose JetStream is not ready yet,
 * and enables it when a test says so: it is stopped and started again with `-js` on the same port
 * (clients reconnect). `requests` counts what clients have sent it (its monitoring's `in_msgs`),
 * so a test can tell that a process has asked JetStream for something before it is enabled.
 */
export class NatsLateJetStream extends Context.Tag("@switchboard/testing/NatsLateJetStream")<
  NatsLateJetStream,
  {
    readonly servers: ReadonlyArray<string>;
    readonly requests: Effect.Effect<number>;
    readonly enableJetStream: Effect.Effect<void>;
  }
>() {
  static readonly layer = Layer.scoped(
    NatsLateJetStream,
    Effect.gen(function* () {
      const image = yield* dockerAndImage;
      const [port = 0, monitor = 0] = yield* freePorts(2);
      // The monitoring port binds to the address `-a` names, 127.0.0.1.
      const args = ["-a", "127.0.0.1", "-p", String(port), "-m", String(monitor)];
      const withoutJetStream = yield* Effect.acquireRelease(Scope.make(), (s) => Scope.close(s, Exit.void));
      yield* Scope.extend(startNode(image, args), withoutJetStream);
      const layerScope = yield* Effect.scope;
      const requests = Effect.tryPromise(async () => {
        const res = await fetch(`http://127.0.0.1:${monitor}/varz`);
        return ((await res.json()) as { readonly in_msgs?: number }).in_msgs ?? 0;
      }).pipe(Effect.orDie);
      const enableJetStream = Effect.gen(function* () {
        yield* Scope.close(withoutJetStream, Exit.void);
        yield* Scope.extend(startNode(image, ["-js", "-sd", "/data", ...args]), layerScope);
        yield* Effect.logInfo(`JetStream enabled on ${url(port)}`);
      }).pipe(Effect.orDie);
      return { servers: [url(port)], requests, enableJetStream };
    }).pipe(Effect.withLogSpan("NatsLateJetStream.layer"))
  );
}
