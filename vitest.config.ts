import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['mesh/**/*.test.ts', 'engine/**/*.test.ts', 'actors/**/*.test.ts', 'test/**/*.test.ts'],
    // Worker processes and TensorFlow.js's wasm backend behave best in child processes; the
    // machines have two cores, so at most two test files run at once.
    pool: 'forks',
    maxWorkers: 2,
    testTimeout: 30_000,
    hookTimeout: 30_000,
  },
});
