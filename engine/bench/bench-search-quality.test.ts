import { describe, expect, it } from 'vitest';
import { REFERENCE_SEED, gapOf, scenarioFiles, summarize } from './bench-search-quality.ts';

describe('search-quality arithmetic', () => {
  it('measures a gap as a fraction of the reference, negative when the short search won', () => {
    expect(gapOf(105, 100)).toBeCloseTo(0.05, 12);
    expect(gapOf(100, 100)).toBe(0);
    expect(gapOf(98, 100)).toBeCloseTo(-0.02, 12);
  });

  it('counts a short search that beat the reference as no gap, in the median and the worst', () => {
    // Clamped: 0, 0, 0.01, 0.03, 0.02 → sorted 0, 0, 0.01, 0.02, 0.03
    expect(summarize([-0.04, 0, 0.01, 0.03, 0.02])).toEqual({ median_gap: 0.01, worst_gap: 0.03 });
    // An even count takes the mean of the middle two.
    expect(summarize([0.01, 0.03, -0.5, 0.05])).toEqual({ median_gap: 0.02, worst_gap: 0.05 });
    expect(summarize([-0.1, -0.2])).toEqual({ median_gap: 0, worst_gap: 0 });
    expect(() => summarize([])).toThrow(/at least one gap/);
  });

  it('takes --scenario repeated or comma-separated, else every cluster scenario', () => {
    expect(scenarioFiles(['a.yaml,b.yaml', ' c.yaml '])).toEqual(['a.yaml', 'b.yaml', 'c.yaml']);
    const all = scenarioFiles(undefined);
    expect(all.length).toBeGreaterThanOrEqual(7);
    expect(all.every((f) => f.startsWith('scenarios/cluster/') && f.endsWith('.yaml'))).toBe(true);
    expect([...all].sort()).toEqual(all);
  });

  it('gives the reference search a seed of its own', () => {
    // The short searches use seeds 1..N.
    expect(REFERENCE_SEED).toBeLessThan(1);
  });
});
