// Test infrastructure: Docker and image bootstrapping (plain async), NATS layers and Switchboard
// image containers (Effect).
export {
  buildSwitchboardImage, dockerdLog, ensureDocker, ensureNatsImage, ensureNodeImage, removeSwitchboardImage, removeLeftoverContainers, resolvedNatsImageVar
} from "./Docker.ts";
export { bundleArgs, bundleOf, type Service as BundledService } from "./Bundles.ts";
export { conformanceDir, ensurePeers, node22 } from "./Peers.ts";
export { NatsCluster, NatsContainerError, NatsLateJetStream, NatsServer } from "./NatsContainer.ts";
export * as SwitchboardContainer from "./SwitchboardContainer.ts";
export { SwitchboardImage } from "./SwitchboardContainer.ts";
