// vitest globalSetup: brings up Docker, the NATS image and the peer tools (test/peers) once per run, in the main process,
// and clears containers a crashed run left behind (ryuk is off). Workers inherit process.env.
import { ensureDocker, ensureNatsImage, removeLeftoverContainers, resolvedNatsImageVar } from "./Docker.ts";
import { ensurePeers } from "./Peers.ts";

export async function setup(): Promise<void> {
  await ensureDocker();
  await removeLeftoverContainers();
  process.env[resolvedNatsImageVar] = await ensureNatsImage();
  await ensurePeers();
}

export async function teardown(): Promise<void> {
  await removeLeftoverContainers();
}
