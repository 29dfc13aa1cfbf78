import { describe, expect, it } from 'vitest';
import { graphCallOf } from './report.ts';

describe('graphCallOf', () => {
  it("reads the algorithm's call from a mesh call's group, and nothing from other groups", () => {
    expect(graphCallOf({ group: 'g0-3-[actor.generate_greedy]-12' })).toBe('actor.generate_greedy');
    expect(graphCallOf({ group: 'g2-setup-actor-sft-4' })).toBeUndefined();
    expect(graphCallOf({})).toBeUndefined();
  });
});
