import { defineConfig } from 'vitest/config';

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
    testTimeout: 30_000,
    hookTimeout: 30_000,
  },
});
