// A vitest sequencer: the chaos suite first, then vitest's own order. The chaos file takes five
// minutes or more and mostly waits on recoveries, while the other fork runs the rest; vitest's
// own order (the largest files first, on a clone with no cache) started it a third of the way
// in, and it was the run's tail (a landing run: 688 s of chaos in a 1,332 s run).
import { BaseSequencer, type TestSpecification } from "vitest/node"

const first = (spec: TestSpecification) => spec.moduleId.includes("/test/chaos/")

export default class ChaosFirst extends BaseSequencer {
  override async sort(files: Array<TestSpecification>): Promise<Array<TestSpecification>> {
    const sorted = await super.sort(files)
    return [...sorted.filter(first), ...sorted.filter((spec) => !first(spec))]
  }
}
