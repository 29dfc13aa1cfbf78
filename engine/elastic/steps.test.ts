import { describe, expect, it } from 'vitest';
import type { ReplanRecord } from '../../mesh/wire/index.ts';
import { iterationPeriods, measuredPeriods, recentPeriod } from './steps.ts';

describe('the period measured after a re-plan', () => {
  it("is wall-clock, from an iteration's last start to the next's; a recovery's new start counts from there; the last iteration has none", () => {
    const starts = [
      { iteration: 0, at: 1000 },
      { iteration: 1, at: 1250 },
      { iteration: 1, at: 2000 }, // iteration 1 began again after a recovery
      { iteration: 2, at: 2200 },
      { iteration: 3, at: 2500 },
    ];
    expect(iterationPeriods(starts)).toEqual([
      { iteration: 0, seconds: 0.25 },
      { iteration: 1, seconds: 0.2 },
      { iteration: 2, seconds: 0.3 },
    ]);
    expect(iterationPeriods([])).toEqual([]);
    expect(iterationPeriods([{ iteration: 4, at: 1 }])).toEqual([]);
  });

  it("is each re-plan's median over the iterations it ran, up to the next re-plan; none where it ran none whole", () => {
    const record = (iteration: number) => ({ iteration }) as ReplanRecord;
    // Periods: iterations 0-2 take 0.1 s, 3-5 take 0.2, 0.4, 0.3 s, iteration 6 is the last.
    const at = [0, 100, 200, 300, 500, 900, 1200];
    const starts = at.map((ms, iteration) => ({ iteration, at: ms }));
    const [a, b, c] = measuredPeriods([record(3), record(5), record(6)], starts)!;
    expect(a!.measured_period_after).toBeCloseTo(0.3, 9); // iterations 3 and 4: 0.2, 0.4
    expect(b!.measured_period_after).toBeCloseTo(0.3, 9); // iteration 5
    expect(c!.measured_period_after).toBeUndefined();
  });
});

describe("the current plan's recent period (the machine's speed at a re-plan)", () => {
  const at = (iterations: number[], periods: number[]) => {
    let t = 0;
    return iterations.map((iteration, i) => ({ iteration, at: (t += (periods[i - 1] ?? 0) * 1000) }));
  };

  it('leaves out the iteration that began a run of them (warm-up) and iterations before `since`; the median of the last five', () => {
    // Iteration 0 (the run's first) took 0.9 s; then 0.2, 0.3, 0.4 s; iteration 4 is running.
    expect(recentPeriod(at([0, 1, 2, 3, 4], [0.9, 0.2, 0.3, 0.4]), 0)).toBeCloseTo(0.3, 9);
    expect(recentPeriod(at([0, 1, 2, 3, 4], [0.9, 0.2, 0.3, 0.4]), 2)).toBeCloseTo(0.35, 9);
    // Seven iterations of 0.1 s, then six of 0.5: the last five are the machine's speed now.
    const iterations = Array.from({ length: 15 }, (_, i) => i);
    expect(recentPeriod(at(iterations, [1, ...Array(7).fill(0.1), ...Array(6).fill(0.5)]), 0)).toBeCloseTo(0.5, 9);
  });

  it('after a recovery or a migration, the iteration begun again is warm-up too; none at all: undefined', () => {
    // Iteration 2 began again (a recovery) and took 0.8 s; 3 took 0.25 s.
    expect(recentPeriod(at([0, 1, 2, 2, 3, 4], [0.9, 0.2, 0.05, 0.8, 0.25]), 0)).toBeCloseTo(0.225, 9);
    expect(recentPeriod(at([0, 1], [0.9]), 0)).toBeUndefined();
    expect(recentPeriod([], 0)).toBeUndefined();
  });
});
