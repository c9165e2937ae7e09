// Brings up what testcontainers needs on a machine with no registry: a Docker daemon (started
// here when none answers) and a NATS image built from the Debian nats-server binary.
// Plain async functions, so vitest globalSetup, .ci/run and the benchmark share one implementation.
import { execFile as execFileCallback, spawn } from "node:child_process";
import { copyFile, mkdir, mkdtemp, open, readFile, realpath, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const execFile = promisify(execFileCallback);

const stateDir = "/tmp/sb-docker";
const ownSocket = "unix:///tmp/sb-docker.sock";
const defaultSocket = "unix:///var/run/docker.sock";
const pidFile = `${stateDir}/docker.pid`;
export const dockerdLog = `${stateDir}/dockerd.log`;
const natsServerBinary = "/usr/sbin/nats-server";
const installHint = "apt-get install -y docker.io nats-server";
const startTimeoutMs = 60_000;

/** Workers of a vitest run read the image that globalSetup resolved from this variable. */
export const resolvedNatsImageVar = "TESTCONTAINERS_NATS_IMAGE_RESOLVED";

const docker = (host: string, args: ReadonlyArray<string>, env: NodeJS.ProcessEnv = {}) =>
  execFile("docker", ["-H", host, ...args], {
    env: { ...process.env, ...env },
    timeout: 120_000,
    maxBuffer: 16 * 1024 * 1024
  });

const answers = (host: string): Promise<boolean> =>
  execFile("docker", ["-H", host, "info", "--format", "{{.ServerVersion}}"], { timeout: 10_000 }).then(
    () => true,
    () => false
  );

const isInstalled = (command: string): Promise<boolean> =>
  execFile(command, ["--version"]).then(
    () => true,
    () => false
  );

// A dockerd started by a concurrent caller holds the pid file; starting a second one would fail.
const pidFileOwnerAlive = async (): Promise<boolean> => {
  const pid = await readFile(pidFile, "utf8").catch(() => "");
  const command = await readFile(`/proc/${pid.trim() || "none"}/comm`, "utf8").catch(() => "");
  return command.trim() === "dockerd";
};

// Returns whether the spawned dockerd has exited, so a daemon that dies on start fails fast.
const startDockerd = async (): Promise<() => boolean> => {
  await mkdir(stateDir, { recursive: true });
  const log = await open(dockerdLog, "a");
  let exited = false;
  try {
    const child = spawn(
      "dockerd",
      [
        "-H", ownSocket,
        "--data-root", `${stateDir}/data`,
        "--exec-root", `${stateDir}/exec`,
        "--pidfile", pidFile,
        // Published ports then bind loopback only: tests must not listen on other interfaces.
        "--ip", "127.0.0.1"
      ],
      { detached: true, stdio: ["ignore", log.fd, log.fd] }
    );
    child.on("error", () => (exited = true));
    child.on("exit", () => (exited = true));
    child.unref();
  } finally {
    await log.close();
  }
  return () => exited;
};

const dockerdFailed = async (why: string): Promise<Error> => {
  const tail = await readFile(dockerdLog, "utf8").then(
    (text) => text.trimEnd().split("\n").slice(-5).join("\n"),
    () => ""
  );
  return new Error(`dockerd ${why}; see ${dockerdLog}${tail === "" ? "" : `:\n${tail}`}`);
};

const waitUntilAnswers = async (host: string, hasExited: () => boolean): Promise<void> => {
  const deadline = Date.now() + startTimeoutMs;
  while (Date.now() < deadline) {
    if (await answers(host)) return;
    // A concurrent caller's dockerd holds the pid file: ours exits, theirs is worth waiting for.
    if (hasExited() && !(await pidFileOwnerAlive())) throw await dockerdFailed("exited during start");
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  throw await dockerdFailed(`did not answer on ${host} within ${startTimeoutMs / 1000} s`);
};

const findOrStartDocker = async (): Promise<string> => {
  const candidates = [process.env["DOCKER_HOST"], defaultSocket, ownSocket].filter(
    (host): host is string => host !== undefined && host !== ""
  );
  for (const host of candidates) {
    if (await answers(host)) return host;
  }
  if (!(await isInstalled("dockerd")) || !(await isInstalled("docker"))) {
    throw new Error(`No Docker daemon answers and dockerd is not installed: run \`${installHint}\``);
  }
  const hasExited = (await pidFileOwnerAlive()) ? () => false : await startDockerd();
  await waitUntilAnswers(ownSocket, hasExited);
  return ownSocket;
};

let docker$: Promise<string> | undefined;

/** Returns a DOCKER_HOST that answers, starting our own dockerd if needed, and points testcontainers at it. */
export const ensureDocker = (): Promise<string> =>
  (docker$ ??= findOrStartDocker().then(
    (host) => {
      process.env["DOCKER_HOST"] = host;
      // ryuk would need a pull; the harness removes leftovers itself.
      process.env["TESTCONTAINERS_RYUK_DISABLED"] ??= "true";
      // Without it testcontainers pulls alpine to find the gateway.
      process.env["TESTCONTAINERS_HOST_OVERRIDE"] ??= "127.0.0.1";
      return host;
    },
    (error: unknown) => {
      docker$ = undefined;
      throw error;
    }
  ));

const natsServerVersion = async (): Promise<string> => {
  const { stdout } = await execFile(natsServerBinary, ["--version"]).catch((cause: unknown) => {
    throw new Error(`${natsServerBinary} is missing: run \`${installHint}\``, { cause });
  });
  const version = /v(\d+\.\d+\.\d+)/.exec(stdout)?.[1];
  if (version === undefined) throw new Error(`Unexpected nats-server --version output: ${stdout}`);
  return version;
};

// ldd prints `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` and `/lib64/ld-linux-x86-64.so.2 (0x…)`.
const sharedLibraries = async (binary: string): Promise<ReadonlyArray<string>> => {
  const { stdout } = await execFile("ldd", [binary]);
  return [...stdout.matchAll(/(?:=>\s*)?(\/\S+)\s+\(0x/g)].flatMap((match) => (match[1] === undefined ? [] : [match[1]]));
};

/** What goes into an image built `FROM scratch` around dynamically linked binaries. */
interface ScratchImage {
  /** Binaries of this machine by their path in the image; the libraries ldd lists go to their own paths. */
  readonly binaries: Readonly<Record<string, string>>;
  /** More files for the image, by path in the image. */
  readonly files?: Readonly<Record<string, string>>;
  /** Dockerfile lines after `FROM scratch` and `COPY . /`. */
  readonly instructions: ReadonlyArray<string>;
}

const isImagePresent = (host: string, tag: string): Promise<boolean> =>
  docker(host, ["image", "inspect", tag]).then(
    () => true,
    () => false
  );

const buildScratchImage = async (host: string, tag: string, image: ScratchImage): Promise<void> => {
  const context = await mkdtemp(join(tmpdir(), "sb-scratch-image-"));
  try {
    const place = async (pathInImage: string, write: (target: string) => Promise<void>) => {
      const target = join(context, pathInImage);
      await mkdir(dirname(target), { recursive: true });
      await write(target);
    };
    for (const [path, binary] of Object.entries(image.binaries)) {
      await place(path, (target) => copyFile(binary, target));
      for (const library of await sharedLibraries(binary)) await place(library, (target) => copyFile(library, target));
    }
    for (const [path, content] of Object.entries(image.files ?? {})) await place(path, (target) => writeFile(target, content));
    await writeFile(join(context, "Dockerfile"), ["FROM scratch", "COPY . /", ...image.instructions, ""].join("\n"));
    await writeFile(join(context, ".dockerignore"), "Dockerfile\n.dockerignore\n");
    // The classic builder needs no buildkit image, which could not be pulled here.
    await docker(host, ["build", "-q", "-t", tag, context], { DOCKER_BUILDKIT: "0" });
  } finally {
    await rm(context, { recursive: true, force: true });
  }
};

/** The image for NATS containers: `TESTCONTAINERS_NATS_IMAGE` (e.g. `nats:2.10`) or one built from the local binary. */
export const ensureNatsImage = async (): Promise<string> => {
  const configured = process.env["TESTCONTAINERS_NATS_IMAGE"] || process.env[resolvedNatsImageVar];
  if (configured) return configured;
  const host = await ensureDocker();
  // The version in the tag makes an upgraded binary rebuild the image.
  const tag = `switchboard/nats-scratch:${await natsServerVersion()}`;
  if (!(await isImagePresent(host, tag))) {
    await buildScratchImage(host, tag, {
      binaries: { "nats-server": natsServerBinary },
      instructions: ['ENTRYPOINT ["/nats-server"]', 'CMD ["-js"]']
    });
  }
  return tag;
};

/** The user the official Node images run as; the Switchboard image runs as its uid. */
const nodeUser = { passwd: "root:x:0:0:root:/root:/sbin/nologin\nnode:x:1000:1000:node:/home/node:/sbin/nologin\n", group: "root:x:0:\nnode:x:1000:\n" };

/**
 * A stand-in for the official `node` image, for `docker build --build-arg NODE_IMAGE=…` where no
 * registry answers: the Node binary running this process (Debian's `nodejs` on CI), `/bin/sh` (the
 * Dockerfile's RUN needs one), their libraries, and a `node` user with uid 1000 as in the official
 * image. No npm, so it takes `BUNDLES=prebuilt` builds only. `TESTCONTAINERS_NODE_IMAGE` (e.g.
 * `node:22-bookworm-slim`) replaces it.
 */
export const ensureNodeImage = async (): Promise<string> => {
  const configured = process.env["TESTCONTAINERS_NODE_IMAGE"];
  if (configured) return configured;
  const host = await ensureDocker();
  // The suffix changes whenever what goes into the image does, so an old image is not reused.
  const tag = `switchboard/node-scratch:${process.versions.node}-sh`;
  if (!(await isImagePresent(host, tag))) {
    await buildScratchImage(host, tag, {
      binaries: { "usr/local/bin/node": await realpath(process.execPath), "bin/sh": await realpath("/bin/sh") },
      files: { "etc/passwd": nodeUser.passwd, "etc/group": nodeUser.group },
      instructions: ["ENV PATH=/usr/local/bin:/usr/bin:/bin", 'CMD ["node"]']
    });
  }
  return tag;
};

const repoRoot = fileURLToPath(new URL("../../../", import.meta.url));

/**
 * Builds deploy/Dockerfile with `BUNDLES=prebuilt` as `tag` on `base` (see ensureNodeImage): first
 * the bundles it copies (turbo, cached when nothing changed), then the image (the classic builder
 * caches each COPY by content). Its default, `npm ci` inside the build, needs npm in the base.
 */
export const buildSwitchboardImage = async (tag: string, base: string): Promise<void> => {
  const host = await ensureDocker();
  await execFile(
    join(repoRoot, "node_modules/.bin/turbo"),
    ["run", "build", "--filter=./services/*", "--filter=@switchboard/postmessage", "--output-logs=errors-only"],
    { cwd: repoRoot, env: { ...process.env, TURBO_TELEMETRY_DISABLED: "1", DO_NOT_TRACK: "1" }, timeout: 180_000, maxBuffer: 16 * 1024 * 1024 }
  );
  const build = (...args: ReadonlyArray<string>) =>
    docker(
      host,
      ["build", "-q", "--force-rm", "-f", join(repoRoot, "deploy/Dockerfile"), "--build-arg", "BUNDLES=prebuilt", "--build-arg", `NODE_IMAGE=${base}`, ...args, repoRoot],
      { DOCKER_BUILDKIT: "0" }
    );
  // The build stage first, under a tag of its own, so that removeSwitchboardImage can remove it
  // too: untagged, it would stay behind as a dangling image of some 200 MB after every run.
  await build("--target", "build", "-t", buildStageTag(tag));
  await build("-t", tag);
};

const buildStageTag = (tag: string) => `${tag}-build-stage`;

/**
 * Removes an image built by buildSwitchboardImage, with its build stage, and build stages older
 * than 10 minutes that lost their tag (when the bundles changed between the two builds, the second
 * made a build stage of its own). The age spares the stages of builds going on now.
 */
export const removeSwitchboardImage = async (tag: string): Promise<void> => {
  const host = await ensureDocker();
  await docker(host, ["image", "rm", tag, buildStageTag(tag)]);
  await docker(host, ["image", "prune", "-f", "--filter", "label=org.switchboard.stage=build", "--filter", "until=10m"]);
};

/** The label naming the test process that started a container, so cleanup spares live runs. */
export const ownerLabel = "switchboard.owner-pid";

const isAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    // EPERM: it exists but belongs to someone else, so it is alive.
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
};

/**
 * Removes testcontainers containers whose owning process is gone (ryuk, which would do this, can't
 * be pulled here). Containers of a test run still going on the same daemon are left alone.
 */
export const removeLeftoverContainers = async (): Promise<number> => {
  const host = await ensureDocker();
  const { stdout } = await docker(host, [
    "ps", "-a", "--filter", "label=org.testcontainers=true", "--format", `{{.ID}} {{.Label "${ownerLabel}"}}`
  ]);
  const orphans = stdout
    .split("\n")
    .map((line) => line.trim().split(" "))
    .filter(([id, owner]) => id !== undefined && id !== "" && !(owner !== undefined && owner !== "" && isAlive(Number(owner))))
    .map(([id]) => id as string);
  if (orphans.length > 0) await docker(host, ["rm", "-f", "-v", ...orphans]);
  return orphans.length;
};
