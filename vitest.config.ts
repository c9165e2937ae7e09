import { defineConfig } from "vitest/config"

/** What both projects share; the global setup and the reporters are the run's, once. */
const shared = {
  testTimeout: 30_000,
  hookTimeout: 120_000,
  pool: "forks",
  // Two cores: more workers than that only adds contention to timing-sensitive socket tests.
  poolOptions: { forks: { maxForks: 2, minForks: 1 } }
} as const

export default defineConfig({
  test: {
    // Paths, not package imports: vitest transforms TypeScript given by path.
    globalSetup: ["./libs/testing/src/globalSetup.ts"],
    reporters: ["default", "./libs/testing/src/SummaryReporter.ts"],
    // The pool is the run's, not a project's: without these here it ran one fork at a time.
    pool: shared.pool,
    poolOptions: shared.poolOptions,
    // The chaos suite runs alone, after the rest: its fourteen containers take both cores, and
    // beside them the rest's process and timing tests failed in landing runs, and chaos with them
    // (723 s against ~320 s alone), whichever of the two started first.
    projects: [
      {
        test: {
          ...shared,
          name: "suite",
          include: ["libs/*/test/**/*.test.ts", "services/*/test/**/*.test.ts", "clients/*/test/**/*.test.ts", "test/src/**/*.test.ts"],
          sequence: { groupOrder: 0 }
        }
      },
      { test: { ...shared, name: "chaos", include: ["test/chaos/**/*.test.ts"], sequence: { groupOrder: 1 } } }
    ]
  }
})
