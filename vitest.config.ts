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
    testTimeout: 30_000,
    hookTimeout: 30_000,
  },
});
