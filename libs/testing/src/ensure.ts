// Command-line entry for .ci/run and developers: `npx tsx libs/testing/src/ensure.ts`.
// Brings up Docker and the NATS image with the same code the tests use, and prints the DOCKER_HOST.
import { ensureDocker, ensureNatsImage } from "./Docker.ts";

const started = Date.now();
const host = await ensureDocker();
const image = await ensureNatsImage();
console.log(`DOCKER_HOST=${host} NATS image=${image} (${Date.now() - started} ms)`);
