// A vitest reporter that ends the run with one plain line CI counts tests from:
// `Summary: N passed, N failed, N skipped`. vitest's own `Tests  12 passed (12)` is not read by CI.
// Above it, the slowest files: CI keeps only the log's tail, and the suite has a time budget.
import type { Reporter } from "vitest/node";

const SLOWEST = 20;

export default class SummaryReporter implements Reporter {
  onTestRunEnd: NonNullable<Reporter["onTestRunEnd"]> = async (testModules, unhandledErrors) => {
    let passed = 0;
    let failed = unhandledErrors.length;
    let skipped = 0;
    for (const testModule of testModules) {
      let failedHere = 0;
      for (const test of testModule.children.allTests()) {
        const { state } = test.result();
        if (state === "passed") passed++;
        else if (state === "failed") failedHere++;
        else skipped++;
      }
      // A file that does not load, or a failing beforeAll (a layer that cannot start), fails no
      // test case: count it once so the line never says 0 failed for a red run.
      failed += failedHere > 0 ? failedHere : testModule.state() === "failed" ? 1 : 0;
    }
    // The default reporter prints its own summary in the same tick, after this hook starts.
    await new Promise((resolve) => setImmediate(resolve));
    const slowest = [...testModules]
      .map((m) => ({ id: m.moduleId.replace(`${process.cwd()}/`, ""), ms: m.diagnostic().duration }))
      .sort((a, b) => b.ms - a.ms)
      .slice(0, SLOWEST);
    console.log(`Slowest files:\n${slowest.map(({ id, ms }) => `  ${(ms / 1000).toFixed(1).padStart(7)} s  ${id}`).join("\n")}`);
    console.log(`Summary: ${passed} passed, ${failed} failed, ${skipped} skipped`);
  };
}
