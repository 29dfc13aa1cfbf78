import { describe, expect, it } from 'vitest';
import { forwardFlops } from './bench-compute.ts';

describe('forwardFlops', () => {
  it('counts every product of a forward pass, multiply-adds twice', () => {
    // 1 layer, D = 2, V = 3, one row of T = 2 tokens:
    //   QKV, output and MLP: 2·1·2·(3·4 + 4 + 8·4) = 192; attention scores and mixing: 2·2·1·2·2·2 = 32
    //   head 2·1·2·2·3 = 24; the embedding is a lookup, 0 → 248
    expect(forwardFlops({ kind: 'policy', vocab: 3, context: 2, layers: 1, width: 2, heads: 1 }, 1, 2)).toBe(248);
    // A value head has one output instead of V: 248 − 24 + 8 = 232
    expect(forwardFlops({ kind: 'value', vocab: 3, context: 2, layers: 1, width: 2, heads: 1 }, 1, 2)).toBe(232);
  });
});
