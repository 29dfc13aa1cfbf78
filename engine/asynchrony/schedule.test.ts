import { describe, expect, it } from 'vitest';
import { admitted, aheadOf, asynchronyOf, decidedAhead, stalenessSummary, versionOf, versionsProblem } from './schedule.ts';

describe('the schedule of a lagged run', () => {
  it('generates every iteration exactly once, ahead of it, with the version max(0, u − k) that iteration t starts with', () => {
    for (const lag of [1, 2, 3]) {
      const iterations = 9;
      const seen: number[] = [];
      for (let t = 0; t < iterations; t++) {
        for (const u of aheadOf(t, lag, iterations)) {
          expect(u).toBeGreaterThan(t);
          // Iteration t holds version t: exactly the version u's rollouts must come from.
          expect(versionOf(u, lag)).toBe(t);
          seen.push(u);
        }
      }
      // Iteration 0 is generated in its own iteration (with version 0); every other ahead, once.
      expect(seen).toEqual(Array.from({ length: iterations - 1 }, (_, i) => i + 1));
    }
  });

  it('lag 0 is today’s run: nothing ahead, every iteration its own version', () => {
    expect(aheadOf(0, 0, 5)).toEqual([]);
    expect(aheadOf(3, 0, 5)).toEqual([]);
    expect([0, 1, 2, 3].map((u) => versionOf(u, 0))).toEqual([0, 1, 2, 3]);
  });

  it('goes no further than the run', () => {
    expect(aheadOf(0, 2, 2)).toEqual([1]);
    expect(aheadOf(3, 1, 4)).toEqual([]);
  });
});

describe('the modes and their decisions', () => {
  it('the rl keys choose one mode: a recorded schedule replays, else η, else k, else lock-step', () => {
    expect(asynchronyOf({ lag: 0, staleness: 0 })).toBeUndefined();
    expect(asynchronyOf({ lag: 2, staleness: 0 })).toEqual({ mode: 'lag', lag: 2 });
    expect(asynchronyOf({ lag: 0, staleness: 3 })).toEqual({ mode: 'staleness', eta: 3 });
    expect(asynchronyOf({ lag: 0, staleness: 2, versions: [0, 0, 1] })).toEqual({ mode: 'replay', eta: 2, versions: [0, 0, 1] });
  });

  it('admits the next iteration after the last decided while it would be trained at most η updates later', () => {
    // Iteration 2 holds version 2; with η = 2 it may make iterations 3 and 4.
    expect(admitted(2, 2, 2, 10)).toBe(3);
    expect(admitted(2, 3, 2, 10)).toBe(4);
    expect(admitted(2, 4, 2, 10)).toBeUndefined();
    // Decided by an earlier version already: the next after it.
    expect(admitted(2, 3, 1, 10)).toBeUndefined();
    // Never past the run.
    expect(admitted(8, 9, 3, 10)).toBeUndefined();
    expect(admitted(8, 8, 3, 10)).toBe(9);
  });

  it('decides ahead what the record says for this version, and the lag or a replayed schedule otherwise', async () => {
    const written = new Map([
      [3, 1],
      [4, 2],
      [5, 2],
    ]);
    const recorded = async (u: number) => written.get(u);
    expect(await decidedAhead({ mode: 'staleness', eta: 3 }, 2, 10, recorded)).toEqual([4, 5]);
    expect(await decidedAhead({ mode: 'staleness', eta: 3 }, 1, 10, recorded)).toEqual([3]);
    expect(await decidedAhead({ mode: 'staleness', eta: 1 }, 2, 10, recorded)).toEqual([]);
    expect(await decidedAhead({ mode: 'replay', eta: 2, versions: [0, 0, 0, 1, 3, 3] }, 3, 6, recorded)).toEqual([4, 5]);
    expect(await decidedAhead({ mode: 'replay', eta: 2, versions: [0, 0, 0, 1, 3, 3] }, 2, 6, recorded)).toEqual([]);
    expect(await decidedAhead({ mode: 'lag', lag: 2 }, 0, 10, recorded)).toEqual([1, 2]);
  });

  it('refuses a recorded schedule that no free-running run could have made, naming the iteration', () => {
    expect(versionsProblem([0, 0, 1, 1], 2, 4)).toBeUndefined();
    expect(versionsProblem([0, 0, 1], 2, 4)).toMatch(/one version per iteration \(4\), got 3/);
    expect(versionsProblem([0, 2, 2, 2], 2, 4)).toMatch(/iteration 1's rollouts cannot come from version 2/);
    expect(versionsProblem([0, 0, 0, 0], 2, 4)).toMatch(/iteration 3's rollouts from version 0 are 3 updates old, more than rl.staleness \(2\)/);
    expect(versionsProblem([0, 1, 0, 2], 2, 4)).toMatch(/iteration 2's version 0 is older than iteration 1's \(1\)/);
  });

  it('sums a run up: mean and max age, and iterations per age', () => {
    expect(stalenessSummary([0, 1, 2, 2])).toEqual({ mean: 1.25, max: 2, histogram: { 0: 1, 1: 1, 2: 2 } });
    expect(stalenessSummary([])).toEqual({ mean: 0, max: 0, histogram: {} });
  });
});
