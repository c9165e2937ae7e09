// Command-line entry for .ci/run and developers: `npx tsx libs/testing/src/ensure.ts`.
// Brings up Docker, the NATS image and the peer tools with the same code the tests use, and prints the DOCKER_HOST.
import { ensureDocker, ensureNatsImage } from "./Docker.ts";
import { ensurePeers } from "./Peers.ts";

const started = Date.now();
const host = await ensureDocker();
const image = await ensureNatsImage();
const peers = await ensurePeers();
console.log(`DOCKER_HOST=${host} NATS image=${image} ${peers} (${Date.now() - started} ms)`);
