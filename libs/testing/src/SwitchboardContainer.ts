// The Switchboard image (deploy/Dockerfile) and its processes as testcontainers, run the way an
// operator should run them: non-root, read-only root filesystem, no capabilities, and host
// networking with every listener on 127.0.0.1 (a published port would bind more than loopback).
import { Context, Data, Duration, Effect, Layer } from "effect";
import { GenericContainer, getContainerRuntimeClient, Wait } from "testcontainers";
import { buildSwitchboardImage, ensureNodeImage, ownerLabel, removeSwitchboardImage } from "./Docker.ts";
import { freePorts } from "./FreePorts.ts";

export class SwitchboardContainerError extends Data.TaggedError("SwitchboardContainerError")<{
  readonly reason: "ImageBuild" | "ContainerStart" | "Exec" | "ContainerStop" | "ContainerKill";
  readonly cause: unknown;
}> {
  override get message(): string {
    return `${this.reason}: ${this.cause instanceof Error ? this.cause.message : String(this.cause)}`;
  }
}

/** The uid:gid the image runs as (the official Node images' `node` user). */
export const imageUser = "1000:1000";

export class SwitchboardImage extends Context.Tag("@switchboard/testing/SwitchboardImage")<
  SwitchboardImage,
  { readonly tag: string; readonly base: string }
>() {
  /** The image for this test process, built from the bundles in the working tree; removed with the scope. */
  static readonly layer = Layer.scoped(
    SwitchboardImage,
    Effect.gen(function* () {
      const tag = `switchboard/switchboard:test-${process.pid}`;
      const base = yield* Effect.acquireRelease(
        Effect.tryPromise({
          try: async () => {
            const base = await ensureNodeImage();
            await buildSwitchboardImage(tag, base);
            return base;
          },
          catch: (cause) => new SwitchboardContainerError({ reason: "ImageBuild", cause })
        }),
        () => Effect.tryPromise(() => removeSwitchboardImage(tag)).pipe(Effect.ignoreLogged)
      );
      yield* Effect.logInfo(`Switchboard image ${tag} built on ${base}`);
      return { tag, base };
    }).pipe(Effect.withLogSpan("SwitchboardImage.layer"))
  );
}

/** A hardened container: the flags testcontainers has no builder method for. */
class HardenedContainer extends GenericContainer {
  constructor(image: string) {
    super(image);
    this.hostConfig.ReadonlyRootfs = true;
  }
}

export interface SwitchboardContainerOptions {
  /** The command after the image's entrypoint; the image's (the all-in-one) when absent. */
  readonly command?: ReadonlyArray<string>;
  readonly env?: Readonly<Record<string, string>>;
  /** A log line that says the process serves. */
  readonly ready: RegExp;
  readonly startTimeout?: Duration.DurationInput;
}

export interface StoppedContainer {
  readonly exitCode: number;
  /** From `docker stop` until the container had exited. */
  readonly took: Duration.Duration;
}

export interface SwitchboardContainer {
  readonly id: string;
  /** `http://127.0.0.1:<PORT>`: the port it was given in `PORT`. */
  readonly url: string;
  readonly port: number;
  /** Everything it printed so far, stdout and stderr. */
  readonly output: () => string;
  /** Runs a command in the container, as its user (the image has node and no shell). */
  readonly exec: (command: ReadonlyArray<string>) => Effect.Effect<{ readonly exitCode: number; readonly output: string }, SwitchboardContainerError>;
  /** `docker stop`: SIGTERM, then SIGKILL after `grace`. The container stays until the scope closes. */
  readonly stop: (grace: Duration.DurationInput) => Effect.Effect<StoppedContainer, SwitchboardContainerError>;
  /**
   * Sends `signal` (SIGKILL when omitted: a crash, with no chance to clean up) and returns once the
   * container has exited. The container stays until the scope closes, so its output can be read.
   */
  readonly kill: (signal?: NodeJS.Signals) => Effect.Effect<StoppedContainer, SwitchboardContainerError>;
}

/**
 * Starts one process from the image with `HOST=127.0.0.1` and a free `PORT`, and returns once its
 * log matches `ready`. Removed (killed if still running) when the scope closes.
 */
export const start = (options: SwitchboardContainerOptions) =>
  Effect.gen(function* () {
    const { tag } = yield* SwitchboardImage;
    const [port = 0] = yield* Effect.tryPromise({
      try: () => freePorts(1),
      catch: (cause) => new SwitchboardContainerError({ reason: "ContainerStart", cause })
    });
    let output = "";
    const base = new HardenedContainer(tag)
      .withLabels({ [ownerLabel]: String(process.pid) })
      .withNetworkMode("host")
      .withUser(imageUser)
      .withDroppedCapabilities("ALL")
      .withSecurityOpt("no-new-privileges")
      // Host networking: a fixed metrics port would collide between containers, so each picks one.
      .withEnvironment({ METRICS_PORT: "0", ...options.env, HOST: "127.0.0.1", PORT: String(port) })
      .withLogConsumer((stream) => stream.on("data", (chunk: Buffer | string) => (output += chunk.toString())))
      .withWaitStrategy(Wait.forLogMessage(options.ready))
      .withStartupTimeout(Duration.toMillis(options.startTimeout ?? "30 seconds"));
    const container = options.command === undefined ? base : base.withCommand([...options.command]);
    const started = yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: () => container.start(),
        catch: (cause) => new SwitchboardContainerError({ reason: "ContainerStart", cause: withOutput(cause, output) })
      }),
      (started) =>
        Effect.tryPromise(async () => {
          const runtime = await getContainerRuntimeClient();
          await runtime.container.getById(started.getId()).remove({ force: true, v: true });
        }).pipe(Effect.ignoreLogged)
    );
    const stop = Effect.fn("SwitchboardContainer.stop")(function* (grace: Duration.DurationInput) {
      const startedAt = Date.now();
      const { StatusCode } = yield* Effect.tryPromise({
        try: async () => {
          const docker = (await getContainerRuntimeClient()).container.getById(started.getId());
          await docker.stop({ t: Math.ceil(Duration.toSeconds(grace)) });
          return (await docker.wait()) as { readonly StatusCode: number };
        },
        catch: (cause) => new SwitchboardContainerError({ reason: "ContainerStop", cause })
      }).pipe(
        // Docker kills it once the grace is over; more than that means the daemon itself is stuck.
        Effect.timeoutFail({
          duration: Duration.sum(grace, "10 seconds"),
          onTimeout: () => new SwitchboardContainerError({ reason: "ContainerStop", cause: "docker stop did not return" })
        })
      );
      return { exitCode: StatusCode, took: Duration.millis(Date.now() - startedAt) };
    });
    const kill = Effect.fn("SwitchboardContainer.kill")(function* (signal: NodeJS.Signals = "SIGKILL") {
      const startedAt = Date.now();
      const { StatusCode } = yield* Effect.tryPromise({
        try: async () => {
          const docker = (await getContainerRuntimeClient()).container.getById(started.getId());
          await docker.kill({ signal });
          return (await docker.wait()) as { readonly StatusCode: number };
        },
        catch: (cause) => new SwitchboardContainerError({ reason: "ContainerKill", cause })
      }).pipe(
        // SIGKILL ends a process at once; a signal the process handles gets a graceful shutdown's time.
        Effect.timeoutFail({
          duration: "30 seconds",
          onTimeout: () => new SwitchboardContainerError({ reason: "ContainerKill", cause: `the container did not exit within 30 s of ${signal}` })
        })
      );
      return { exitCode: StatusCode, took: Duration.millis(Date.now() - startedAt) };
    });
    return {
      id: started.getId(),
      url: `http://127.0.0.1:${port}`,
      port,
      output: () => output,
      exec: (command: ReadonlyArray<string>) =>
        Effect.tryPromise({
          try: () => started.exec([...command]),
          catch: (cause) => new SwitchboardContainerError({ reason: "Exec", cause })
        }).pipe(
          Effect.timeoutFail({
            duration: "15 seconds",
            onTimeout: () => new SwitchboardContainerError({ reason: "Exec", cause: `${command.join(" ")} did not end within 15 s` })
          }),
          Effect.map(({ exitCode, output }) => ({ exitCode, output }))
        ),
      stop,
      kill
    } satisfies SwitchboardContainer;
  });

const withOutput = (cause: unknown, output: string): Error =>
  new Error(`${cause instanceof Error ? cause.message : String(cause)}\n--- container output ---\n${output}`, { cause });
