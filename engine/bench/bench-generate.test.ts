import { describe, expect, it } from 'vitest';
import { growth } from './bench-generate.ts';

describe('growth', () => {
  it('is the time per token at the longest length over that at the shortest', () => {
    // 2 ms per token at 16, 3 ms at 256: 1.5, whatever the order the lengths come in.
    expect(growth({ '16': 0.002, '64': 0.0025, '256': 0.003 }, [64, 256, 16])).toBeCloseTo(1.5, 12);
  });
});
