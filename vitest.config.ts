import { defineConfig } from "vitest/config"
import ChaosFirst from "./libs/testing/src/Sequencer.ts"

export default defineConfig({
  test: {
    include: ["libs/*/test/**/*.test.ts", "services/*/test/**/*.test.ts", "clients/*/test/**/*.test.ts", "test/src/**/*.test.ts", "test/chaos/**/*.test.ts"],
    // Paths, not package imports: vitest transforms TypeScript given by path.
    globalSetup: ["./libs/testing/src/globalSetup.ts"],
    reporters: ["default", "./libs/testing/src/SummaryReporter.ts"],
    testTimeout: 30_000,
    hookTimeout: 120_000,
    sequence: { sequencer: ChaosFirst },
    pool: "forks",
    // Two cores: more workers than that only adds contention to timing-sensitive socket tests.
    poolOptions: { forks: { maxForks: 2, minForks: 1 } }
  }
})
