// Peer tools that need Node >= 22 (the MCP conformance suite), installed from test/peers' own lock:
// outside the workspaces, because the npm package `node` links a `node` bin that `npm run` would put
// first on PATH, and the project itself runs on Node 20. Plain async, like Docker.ts, so vitest
// globalSetup and .ci/run share it; a run on a machine that has them installed does nothing.
import { execFile as execFileCallback } from "node:child_process";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const execFile = promisify(execFileCallback);

export const peersDir = fileURLToPath(new URL("../../../test/peers/", import.meta.url));
/** Node 22 from the npm package `node`: for running peer tools, never the project. */
export const node22 = join(peersDir, "node_modules/node/bin/node");
export const conformanceDir = join(peersDir, "node_modules/@modelcontextprotocol/conformance");

const versionOf = (dir: string) =>
  readFile(join(dir, "package.json"), "utf8").then((text) => (JSON.parse(text) as { version?: string }).version, () => undefined);

/** Whether every peer in test/peers/package.json is installed at its pinned version. */
const installed = async (): Promise<boolean> => {
  const manifest = JSON.parse(await readFile(join(peersDir, "package.json"), "utf8")) as { devDependencies: Record<string, string> };
  const found = await Promise.all(
    Object.entries(manifest.devDependencies).map(async ([name, version]) => (await versionOf(join(peersDir, "node_modules", name))) === version)
  );
  return found.every(Boolean);
};

/** Installs test/peers from its lock unless it is in place already; returns what it did. */
export const ensurePeers = async (): Promise<string> => {
  if (await installed()) return "peers installed";
  await execFile("npm", ["ci", "--no-audit", "--no-fund"], { cwd: peersDir, timeout: 300_000, maxBuffer: 16 * 1024 * 1024 });
  if (!(await installed())) throw new Error(`npm ci in ${peersDir} finished, but the pinned peers are not in place`);
  return "peers installed now";
};
