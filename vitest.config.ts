import { readFileSync } from 'node:fs';
import { relative } from 'node:path';
import { defineConfig } from 'vitest/config';
import { BaseSequencer, type TestSpecification } from 'vitest/node';

/**
 * The slowest files first, by the seconds each took in the last CI run (.ci/test-seconds.json,
 * which .ci/run rewrites): three forks draw files from one queue, so the run ends soonest when
 * no long file starts last. A file the table does not know (a new one) goes first.
 */
class SlowestFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    let seconds: Record<string, number> = {};
    try {
      seconds = JSON.parse(readFileSync('.ci/test-seconds.json', 'utf8')) as Record<string, number>;
    } catch {
      return super.sort(files);
    }
    const of = (f: TestSpecification) => seconds[relative(process.cwd(), f.moduleId)] ?? Number.POSITIVE_INFINITY;
    return [...files].sort((a, b) => of(b) - of(a));
  }
}

export default defineConfig({
  test: {
    include: ['mesh/**/*.test.ts', 'engine/**/*.test.ts', 'actors/**/*.test.ts', 'test/**/*.test.ts'],
    // Worker processes and TensorFlow.js's wasm backend behave best in child processes. The
    // machines have two cores, but the integration files spend much of their time waiting on their
    // runs' processes and the bus: three files at once keep both cores busy (a clean-clone run
    // under other load: 474 s of tests with three, 549 s with two).
    pool: 'forks',
    maxWorkers: 3,
    // A fork runs its files one after another in one module graph: TensorFlow.js, tsx's transforms
    // and ferry's modules are imported once a fork instead of once a file (a full run here: 30 s
    // of imports against 167 s, 421 s of tests against 503 s). A test holds to what it made
    // itself, not to a fresh process's state.
    isolate: false,
    sequence: { sequencer: SlowestFirst },
    testTimeout: 30_000,
    hookTimeout: 30_000,
  },
});
