// Each service bundled once per test run, as the container image ships it (deploy/bundle.mjs), so
// that the tests' processes start from one file on plain Node. Started through tsx instead, each
// process spent about 5 s of CPU transforming and resolving thousands of modules before its first
// line ran (0.7 s from the bundle, 1.5 s with source maps): the suite starts a few hundred.
// Each run bundles into a folder of its own under `services/<name>/.tmp/`, named in the environment
// the workers inherit: two runs in one tree never start a process from a file the other is writing.
import { execFile as execFileCallback } from "node:child_process";
import { readdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const execFile = promisify(execFileCallback);

const repoRoot = fileURLToPath(new URL("../../../", import.meta.url));

export const services = ["auth", "router", "broker", "registry", "edge", "all-in-one"] as const;
export type Service = (typeof services)[number];

/** The environment variable that names this run's folder, set by `bundleServices`. */
const RUN_DIR = "SB_TEST_BUNDLES";

/** Where this run's bundle of `service` is, relative to the repository's root. */
export const bundleOf = (service: Service): string => {
  const dir = process.env[RUN_DIR];
  if (dir === undefined) throw new Error(`${RUN_DIR} is unset: the services are bundled by vitest's globalSetup (libs/testing/src/globalSetup.ts)`);
  return `services/${service}/${dir}/main.js`;
};

/** Node's arguments that start this run's bundle of `service`, with its source maps (as the image runs it). */
export const bundleArgs = (service: Service): ReadonlyArray<string> => ["--enable-source-maps", bundleOf(service)];

/** Bundles every service's `src/main.ts` (a few seconds on a quiet machine); returns what it did. */
export const bundleServices = async (): Promise<string> => {
  const started = Date.now();
  await removeOrphans();
  process.env[RUN_DIR] = `.tmp/run-${process.pid}`;
  // One esbuild run for all six: they share most of their modules, parsed once.
  const pairs = services.flatMap((service) => [`services/${service}/src/main.ts`, bundleOf(service)]);
  await execFile(process.execPath, ["deploy/bundle.mjs", ...pairs], { cwd: repoRoot, timeout: 300_000 }).catch((e: unknown) => {
    throw new Error(`bundling the services for the tests failed: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
  });
  return `${services.length} services bundled (${Date.now() - started} ms)`;
};

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    // EPERM: it runs, as another user.
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
};

/** Removes what runs that ended without their teardown (killed, crashed) left. */
const removeOrphans = () =>
  Promise.all(
    services.map(async (service) => {
      const tmp = join(repoRoot, "services", service, ".tmp");
      const entries = await readdir(tmp).catch(() => []);
      await Promise.all(
        entries
          .filter((name) => /^run-\d+$/.test(name) && !alive(Number(name.slice(4))))
          .map((name) => rm(join(tmp, name), { recursive: true, force: true }))
      );
    })
  );

/** Removes this run's bundles. */
export const removeBundles = async (): Promise<void> => {
  if (process.env[RUN_DIR] === undefined) return;
  await Promise.all(services.map((service) => rm(join(repoRoot, bundleOf(service), ".."), { recursive: true, force: true })));
};
