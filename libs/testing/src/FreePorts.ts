// Ports for processes that share the host's network (host-networked containers), probed on 127.0.0.1.
import { createServer, type Server } from "node:net";

const listenOnAnyPort = (server: Server) =>
  new Promise<number>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      if (address !== null && typeof address === "object") resolve(address.port);
      else reject(new Error(`unexpected listen address ${String(address)}`));
    });
  });

/** `count` distinct ports free right now: every probe stays open until all are read. */
export const freePorts = async (count: number): Promise<ReadonlyArray<number>> => {
  const servers = Array.from({ length: count }, () => createServer());
  try {
    return await Promise.all(servers.map(listenOnAnyPort));
  } finally {
    await Promise.all(servers.map((server) => new Promise((resolve) => server.close(resolve))));
  }
};
