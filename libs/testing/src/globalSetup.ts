// vitest globalSetup: brings up Docker, the NATS image and the peer tools (test/peers), and bundles the services the
// tests start as processes, once per run, in the main process,
// and clears containers a crashed run left behind (ryuk is off). Workers inherit process.env.
import { ensureDocker, ensureNatsImage, removeLeftoverContainers, resolvedNatsImageVar } from "./Docker.ts";
import { bundleServices, removeBundles } from "./Bundles.ts";
import { ensurePeers } from "./Peers.ts";

export async function setup(): Promise<void> {
  await ensureDocker();
  await removeLeftoverContainers();
  process.env[resolvedNatsImageVar] = await ensureNatsImage();
  await Promise.all([ensurePeers(), bundleServices()]);
}

export async function teardown(): Promise<void> {
  await Promise.all([removeLeftoverContainers(), removeBundles()]);
}
