import { describe, it, expect } from 'vitest';
import { Rng, Stream, sampleToken, samplingProblem, seedOf } from './rng.ts';

describe('seedOf', () => {
  it('is deterministic and a 32-bit unsigned integer', () => {
    for (const parts of [[], [0], [1, 2, 3], [7, Stream.sample, 12, 3]]) {
      const s = seedOf(...parts);
      expect(seedOf(...parts)).toBe(s);
      expect(Number.isInteger(s)).toBe(true);
      expect(s).toBeGreaterThanOrEqual(0);
      expect(s).toBeLessThan(2 ** 32);
    }
  });

  it('keeps the values other processes derived (golden values: a change here breaks recovery across versions)', () => {
    expect(seedOf()).toBe(2872998923);
    expect(seedOf(0)).toBe(1500062585);
    expect(seedOf(1, 2, 3)).toBe(556913344);
  });

  it('is sensitive to every part and to their order', () => {
    const base = [11, Stream.sample, 5, 9];
    const s = seedOf(...base);
    for (let i = 0; i < base.length; i++) {
      for (const delta of [1, -1, 1 << 16]) {
        const changed = base.slice();
        changed[i]! += delta;
        expect(seedOf(...changed)).not.toBe(s);
      }
    }
    expect(seedOf(9, 5, Stream.sample, 11)).not.toBe(s);
    expect(seedOf(1, 2)).not.toBe(seedOf(2, 1));
    // A trailing zero is a part too.
    expect(seedOf(1, 2, 0)).not.toBe(seedOf(1, 2));
  });

  it('tells apart values that share their low 32 bits, and negative values', () => {
    expect(seedOf(2 ** 32 + 5)).not.toBe(seedOf(5));
    expect(seedOf(-1)).not.toBe(seedOf(2 ** 32 - 1));
  });

  it('gives distinct seeds over a grid of (seed, purpose, iteration, index)', () => {
    const seen = new Set<number>();
    for (let seed = 0; seed < 4; seed++) for (const purpose of Object.values(Stream)) for (let it = 0; it < 10; it++) for (let i = 0; i < 10; i++) seen.add(seedOf(seed, purpose, it, i));
    expect(seen.size).toBe(4 * Object.keys(Stream).length * 10 * 10);
  });
});

describe('Rng', () => {
  it('is mulberry32: matches the reference implementation', () => {
    // Reference (bryc/code, PRNGs.md) for seeds 0 and 1, first three 32-bit outputs.
    const r0 = new Rng(0);
    expect([r0.nextU32(), r0.nextU32(), r0.nextU32()]).toEqual([1144304738, 1416247, 958946056]);
    const r1 = new Rng(1);
    expect([r1.nextU32(), r1.nextU32(), r1.nextU32()]).toEqual([2693262067, 11749833, 2265367787]);
  });

  it('uniform joins two outputs into 53 bits', () => {
    // seed 0: outputs 1144304738 and 1416247; 1416247 >>> 11 = 691 (1416247 / 2048 = 691.5…)
    // uniform = (1144304738 · 2^21 + 691) / 2^53
    expect(new Rng(0).uniform()).toBe((1144304738 * 2 ** 21 + 691) / 2 ** 53);
  });

  it('is reproducible from its seed, and different seeds differ', () => {
    const a = new Rng(42);
    const b = new Rng(42);
    const c = new Rng(43);
    const xs = Array.from({ length: 100 }, () => a.uniform());
    expect(Array.from({ length: 100 }, () => b.uniform())).toEqual(xs);
    expect(Array.from({ length: 100 }, () => c.uniform())).not.toEqual(xs);
  });

  it('takes the seed modulo 2^32', () => {
    expect(new Rng(-1).nextU32()).toBe(new Rng(0xffffffff).nextU32());
    expect(new Rng(2 ** 32 + 3).nextU32()).toBe(new Rng(3).nextU32());
  });

  it('uniform is in [0, 1), int(n) in [0, n) and covers every value', () => {
    const r = new Rng(7);
    const counts = new Array(6).fill(0);
    for (let i = 0; i < 6000; i++) {
      const u = r.uniform();
      expect(u).toBeGreaterThanOrEqual(0);
      expect(u).toBeLessThan(1);
      counts[r.int(6)] += 1;
    }
    for (const c of counts) expect(c).toBeGreaterThan(800); // 1000 expected each
  });

  it('normal has mean ≈ 0 and std ≈ 1 (20000 draws, seed fixed)', () => {
    const r = new Rng(3);
    const n = 20000;
    const xs = Array.from({ length: n }, () => r.normal());
    const m = xs.reduce((a, b) => a + b, 0) / n;
    const sd = Math.sqrt(xs.reduce((a, b) => a + (b - m) ** 2, 0) / n);
    // standard error of the mean is 1/√20000 ≈ 0.007
    expect(Math.abs(m)).toBeLessThan(0.03);
    expect(Math.abs(sd - 1)).toBeLessThan(0.03);
    expect(xs.every(Number.isFinite)).toBe(true);
  });

  it('permutation is a permutation of 0..n-1, reproducible, and not the identity', () => {
    for (const n of [0, 1, 2, 5, 64]) {
      const p = new Rng(n + 1).permutation(n);
      expect(p.slice().sort((a, b) => a - b)).toEqual([...Array(n).keys()]);
      expect(new Rng(n + 1).permutation(n)).toEqual(p);
    }
    expect(new Rng(1).permutation(64)).not.toEqual([...Array(64).keys()]);
    expect(new Rng(1).permutation(64)).not.toEqual(new Rng(2).permutation(64));
  });
});

describe('sampleToken', () => {
  const f32 = (xs: number[]) => new Float32Array(xs);

  it('equal logits: CDF boundaries at 1/4, 2/4, 3/4; u on a boundary takes the next token', () => {
    // w = [1, 1, 1, 1], sum = 4, target = 4u; token i is the first with 4u < i + 1
    const logits = f32([0.5, 0.5, 0.5, 0.5]);
    expect(sampleToken(logits, 1, 0)).toBe(0);
    expect(sampleToken(logits, 1, 0.2499)).toBe(0);
    expect(sampleToken(logits, 1, 0.25)).toBe(1); // 4·0.25 = 1, not < 1
    expect(sampleToken(logits, 1, 0.4999)).toBe(1);
    expect(sampleToken(logits, 1, 0.5)).toBe(2);
    expect(sampleToken(logits, 1, 0.75)).toBe(3);
    expect(sampleToken(logits, 1, 0.999999)).toBe(3);
    // temperature does not move the boundaries of equal logits
    expect(sampleToken(logits, 0.1, 0.25)).toBe(1);
    expect(sampleToken(logits, 10, 0.2499)).toBe(0);
  });

  it('temperature moves the boundary: logits [0, 2]', () => {
    // T = 1:   w = [e^-2, 1],  P(0) = 1/(1+e^2) = 0.11920
    // T = 2:   w = [e^-1, 1],  P(0) = 1/(1+e)   = 0.26894
    // T = 0.5: w = [e^-4, 1],  P(0) = 1/(1+e^4) = 0.01799
    const logits = f32([0, 2]);
    expect(1 / (1 + Math.E ** 2)).toBeCloseTo(0.1192, 4);
    expect(sampleToken(logits, 1, 0.119)).toBe(0);
    expect(sampleToken(logits, 1, 0.1193)).toBe(1);
    expect(sampleToken(logits, 2, 0.2689)).toBe(0);
    expect(sampleToken(logits, 2, 0.269)).toBe(1);
    expect(sampleToken(logits, 0.5, 0.0179)).toBe(0);
    expect(sampleToken(logits, 0.5, 0.0181)).toBe(1);
    // the same u = 0.2 picks token 0 at T = 2 and token 1 at T = 1
    expect(sampleToken(logits, 2, 0.2)).toBe(0);
    expect(sampleToken(logits, 1, 0.2)).toBe(1);
  });

  it('three tokens, hand-computed CDF: logits [ln 1, ln 2, ln 5] → P = [1/8, 2/8, 5/8]', () => {
    // float32(ln 2) and float32(ln 5) are off by < 1e-7 relative, so the CDF is
    // [0.125, 0.375, 1] to about 1e-7; u values stay 1e-4 away from the boundaries.
    const logits = f32([0, Math.log(2), Math.log(5)]);
    expect(sampleToken(logits, 1, 0.1249)).toBe(0);
    expect(sampleToken(logits, 1, 0.1251)).toBe(1);
    expect(sampleToken(logits, 1, 0.3749)).toBe(1);
    expect(sampleToken(logits, 1, 0.3751)).toBe(2);
    // T = 2 takes square roots of the weights: w = [1, √2, √5] = [1, 1.41421, 2.23607], sum 4.65028
    // CDF = [0.21504, 0.51915, 1]
    expect(sampleToken(logits, 2, 0.215)).toBe(0);
    expect(sampleToken(logits, 2, 0.2151)).toBe(1);
    expect(sampleToken(logits, 2, 0.5191)).toBe(1);
    expect(sampleToken(logits, 2, 0.5192)).toBe(2);
  });

  it('subtracts the maximum: huge logits do not overflow', () => {
    const logits = f32([1000, 1000, 999]);
    // w = [1, 1, e^-1 = 0.36788], sum = 2.36788, CDF = [0.42232, 0.84464, 1]
    expect(sampleToken(logits, 1, 0.4223)).toBe(0);
    expect(sampleToken(logits, 1, 0.4224)).toBe(1);
    expect(sampleToken(logits, 1, 0.8447)).toBe(2);
  });

  it('a token of probability 0 is never drawn, even at u → 1', () => {
    const logits = f32([0, -Infinity, 0, -Infinity]);
    // w = [1, 0, 1, 0], sum 2: token 0 for u < 1/2, token 2 above
    expect(sampleToken(logits, 1, 0.4999)).toBe(0);
    expect(sampleToken(logits, 1, 0.5)).toBe(2);
    expect(sampleToken(logits, 1, 1 - 2 ** -53)).toBe(2);
  });

  it('a low temperature is greedy', () => {
    // T = 0.001: w = [e^-200, 1, e^-100], so token 1 holds all but ~1e-44 of the mass
    // (u = 0 itself would still pick token 0: the inverse CDF starts there).
    const logits = f32([0.1, 0.3, 0.2]);
    for (const u of [1e-9, 0.3, 0.6, 0.99]) expect(sampleToken(logits, 1e-3, u)).toBe(1);
  });

  it('with uniform u the frequencies follow the softmax', () => {
    const logits = f32([0, Math.log(3)]); // P = [1/4, 3/4]
    const r = new Rng(5);
    let ones = 0;
    for (let i = 0; i < 4000; i++) ones += sampleToken(logits, 1, r.uniform());
    expect(ones / 4000).toBeGreaterThan(0.72);
    expect(ones / 4000).toBeLessThan(0.78);
  });
});

describe('sampleToken with top-k, top-p and greedy', () => {
  // exp(logit − max) = [0.25, 0.5, 0.75, 1]: probabilities 0.1, 0.2, 0.3, 0.4.
  const logits = Float32Array.from([0.25, 0.5, 0.75, 1].map(Math.log));
  const draw = (s: Parameters<typeof sampleToken>[1], us: number[]) => us.map((u) => sampleToken(logits, s, u));

  it('without filters, the inverse CDF in index order (cumulative 0.1, 0.3, 0.6, 1)', () => {
    expect(draw({ temperature: 1 }, [0.05, 0.15, 0.35, 0.65, 0.99])).toEqual([0, 1, 2, 3, 3]);
    expect(draw({ temperature: 1, topK: 0, topP: 1 }, [0.05, 0.15, 0.35, 0.65])).toEqual([0, 1, 2, 3]);
  });

  it('top-k 2 keeps tokens 2 and 3 (0.3 and 0.4, renormalised: 3/7 then 4/7)', () => {
    expect(draw({ temperature: 1, topK: 2 }, [0, 0.42, 0.43, 0.99])).toEqual([2, 2, 3, 3]);
  });

  it('top-p keeps the fewest likeliest tokens whose probability reaches p', () => {
    // ranked 3 (0.4), 2 (0.3), 1 (0.2), 0 (0.1): p = 0.5 needs two, p = 0.4 one, p = 0.75 three
    expect(new Set(draw({ temperature: 1, topP: 0.5 }, [0, 0.2, 0.5, 0.8, 0.99]))).toEqual(new Set([2, 3]));
    expect(new Set(draw({ temperature: 1, topP: 0.4 }, [0, 0.5, 0.99]))).toEqual(new Set([3]));
    expect(draw({ temperature: 1, topP: 0.75 }, [0, 0.3, 0.99])).toEqual([1, 2, 3]); // 0.2, 0.3, 0.4 of 0.9: cuts at 2/9 and 5/9
  });

  it('top-k then top-p over what top-k kept: k = 3 keeps 0.9, p = 0.6 of it needs tokens 3 and 2', () => {
    expect(new Set(draw({ temperature: 1, topK: 3, topP: 0.6 }, [0, 0.3, 0.6, 0.99]))).toEqual(new Set([2, 3]));
  });

  it('ties rank the lower index first; greedy takes the likeliest and ignores u', () => {
    const flat = Float32Array.from([1, 1, 0]);
    expect([0, 0.5, 0.99].map((u) => sampleToken(flat, { temperature: 1, topK: 1 }, u))).toEqual([0, 0, 0]);
    expect(draw({ temperature: 1, greedy: true }, [0, 0.5, 0.99])).toEqual([3, 3, 3]);
  });

  it('a low temperature sharpens, a high one flattens, before the filters', () => {
    // At T = 0.1 token 3 takes almost all the mass; at T = 100 they are nearly equal.
    expect(sampleToken(logits, { temperature: 0.1 }, 0.5)).toBe(3);
    expect(sampleToken(logits, { temperature: 100 }, 0.3)).toBe(1);
  });

  it('bad settings are named', () => {
    expect(samplingProblem({ temperature: 0 })).toBe('temperature must be a positive number, got 0');
    expect(samplingProblem({ temperature: 1, topK: 1.5 })).toBe('top_k must be a whole number ≥ 0 (0: off), got 1.5');
    expect(samplingProblem({ temperature: 1, topP: 0 })).toBe('top_p must be in (0, 1] (1: off), got 0');
    expect(samplingProblem({ temperature: 0.7, topK: 5, topP: 0.9 })).toBeUndefined();
  });
});
