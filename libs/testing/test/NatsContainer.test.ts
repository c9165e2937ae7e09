// The NATS layers against real containers: a single JetStream server, and a 3-node cluster that
// keeps an R3 KV bucket available while its stream leader is killed and restarted.
import { expect, layer } from "@effect/vitest";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { type KV, Kvm } from "@nats-io/kv";
import { connect } from "@nats-io/transport-node";
import { Duration, Effect, Schedule } from "effect";
import { randomUUID } from "node:crypto";
import { NatsCluster, NatsServer } from "../src/index.ts";

const uniqueName = (prefix: string) => `${prefix}_${randomUUID().slice(0, 8)}`;

const connection = (servers: ReadonlyArray<string>) =>
  Effect.acquireRelease(
    Effect.promise(() => connect({ servers: [...servers], reconnectTimeWait: 100 })),
    (nc) => Effect.tryPromise(() => nc.drain()).pipe(Effect.ignore)
  );

// A short JetStream timeout so a request caught by a dead leader fails fast and is retried.
const kvm = (nc: Parameters<typeof jetstream>[0]) => new Kvm(jetstream(nc, { timeout: 1_000 }));

// Bounded: a cluster that never recovers fails the test instead of hanging it.
const untilRecovered = Schedule.spaced("200 millis").pipe(Schedule.upTo("20 seconds"));

layer(NatsServer.layer, { timeout: "60 seconds", excludeTestServices: true })("NatsServer", (it) => {
  it.scoped("round-trips a message and a KV entry", () =>
    Effect.gen(function* () {
      const { url } = yield* NatsServer;
      const nc = yield* connection([url]);
      const subject = `${uniqueName("test")}.greeting`;

      const subscription = nc.subscribe(subject, { max: 1 });
      nc.publish(subject, "hello");
      const received = yield* Effect.promise(async () => {
        for await (const message of subscription) return message.string();
        return undefined;
      });
      expect(received).toBe("hello");

      const kv = yield* Effect.promise(() => kvm(nc).create(uniqueName("bucket")));
      yield* Effect.promise(() => kv.put("greeting", "hello"));
      const entry = yield* Effect.promise(() => kv.get("greeting"));
      expect(entry?.string()).toBe("hello");
    }), 15_000);
});

// KV gets are direct gets, which a follower may answer before it has applied the latest write.
const readUntil = (kv: KV, key: string, expected: string) =>
  Effect.tryPromise(async () => {
    const value = (await kv.get(key))?.string();
    if (value !== expected) throw new Error(`read ${value} from ${key}, expected ${expected}`);
  }).pipe(Effect.retry(untilRecovered));

layer(NatsCluster.layer, { timeout: "60 seconds", excludeTestServices: true })("NatsCluster", (it) => {
  it.scoped("keeps an R3 KV bucket readable and writable while its leader is down", () =>
    Effect.gen(function* () {
      const cluster = yield* NatsCluster;
      const nc = yield* connection(cluster.servers);
      const bucket = uniqueName("bucket");

      // Placing three replicas can fail for a few seconds after the meta leader appears.
      const kv = yield* Effect.tryPromise(() => kvm(nc).create(bucket, { replicas: 3 })).pipe(
        Effect.retry(untilRecovered)
      );
      const write = (value: string) =>
        Effect.tryPromise(() => kv.put("state", value)).pipe(Effect.retry(untilRecovered));
      yield* write("before");

      const jsm = yield* Effect.promise(() => jetstreamManager(nc));
      const { cluster: placement } = yield* Effect.promise(() => jsm.streams.info(`KV_${bucket}`));
      const leader = Math.max(0, ["n0", "n1", "n2"].indexOf(placement?.leader ?? "n0"));
      yield* cluster.kill(leader);

      const [readAfter] = yield* Effect.timed(readUntil(kv, "state", "before"));
      const [writeAfter] = yield* Effect.timed(write("after"));
      yield* readUntil(kv, "state", "after");
      yield* Effect.logInfo(
        `leader n${leader} killed: read after ${Math.round(Duration.toMillis(readAfter))} ms, ` +
          `write after ${Math.round(Duration.toMillis(writeAfter))} ms`
      );

      yield* cluster.restart(leader);
      const server = cluster.servers[leader] ?? "";
      const direct = yield* connection([server]);
      // This client knows only the restarted node, so reading through it shows the node rejoined.
      const rejoined = yield* Effect.tryPromise(() => kvm(direct).open(bucket)).pipe(Effect.retry(untilRecovered));
      yield* readUntil(rejoined, "state", "after");
      expect(`nats://${direct.getServer()}`).toBe(server);
    }), 45_000);
});
