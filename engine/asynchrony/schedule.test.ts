import { describe, expect, it } from 'vitest';
import { aheadOf, versionOf } from './schedule.ts';

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
