// Test infrastructure: Docker and image bootstrapping (plain async) and NATS layers (Effect).
export { dockerdLog, ensureDocker, ensureNatsImage, removeLeftoverContainers, resolvedNatsImageVar } from "./Docker.ts";
export { NatsCluster, NatsContainerError, NatsServer } from "./NatsContainer.ts";
