// vitest globalSetup: brings up Docker and the NATS image once per run, in the main process,
// and clears containers a crashed run left behind (ryuk is off). Workers inherit process.env.
import { ensureDocker, ensureNatsImage, removeLeftoverContainers, resolvedNatsImageVar } from "./Docker.ts";

export async function setup(): Promise<void> {
  await ensureDocker();
  await removeLeftoverContainers();
  process.env[resolvedNatsImageVar] = await ensureNatsImage();
}

export async function teardown(): Promise<void> {
  await removeLeftoverContainers();
}
