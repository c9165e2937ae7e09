import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["libs/*/test/**/*.test.ts", "services/*/test/**/*.test.ts", "clients/*/test/**/*.test.ts", "test/src/**/*.test.ts"],
    testTimeout: 30_000,
    hookTimeout: 120_000,
    pool: "forks",
    env: { LOG_LEVEL: process.env.LOG_LEVEL ?? "warning" }
  }
})
