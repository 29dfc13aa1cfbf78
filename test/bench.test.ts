// The benchmark script runs and prints its figures as one JSON object. No figure is judged here:
// times on a shared two-core machine are for people to read, not for tests to assert.
import { describe, expect, it } from 'vitest';
import { spawnTs } from './helpers.ts';

describe('npm run bench -- iteration --json', () => {
  it('prints tokens per second and the processes-over-NATS / one-process ratio', async () => {
    const child = spawnTs('engine/bench/bench.ts', ['iteration', '--json', '--iterations', '2']);
    expect(await child.exited).toBe(0);
    const line = child
      .output()
      .trim()
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .at(-1)!;
    const r = JSON.parse(line);
    expect(r).toMatchObject({ bench: 'iteration', scenario: 'quickstart', iterations: 2, digests_equal: true });
    for (const key of ['tokens_per_second', 'tokens_per_second_in_process', 'overhead_ratio', 'bus_ms_per_call']) {
      expect(r[key]).toBeGreaterThan(0);
    }
  }, 120_000);

  it('names the benchmarks it has when asked for another', async () => {
    const child = spawnTs('engine/bench/bench.ts', ['nosuch']);
    expect(await child.exited).toBe(2);
    expect(child.output()).toMatch(/unknown benchmark "nosuch"; expected: iteration, realloc/);
  });
});

describe('npm run bench -- realloc --json', () => {
  it('moves a model between layouts across worker processes and reports MB/s, the raw ratio, bytes and memory', async () => {
    // A small model keeps the test short; the benchmark's default is 72 MiB.
    const child = spawnTs('engine/bench/bench.ts', ['realloc', '--json', '--width', '64', '--layers', '2', '--repeats', '1']);
    expect(await child.exited).toBe(0);
    const r = JSON.parse(
      child
        .output()
        .trim()
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .at(-1)!,
    );
    expect(r.bytes_ratio).toBe(1);
    for (const key of ['realloc_mb_s', 'raw_mb_s', 'ratio', 'peak_worker_mb']) expect(r[key]).toBeGreaterThan(0);
    expect(r.workers).toHaveLength(4);
  }, 120_000);
});
