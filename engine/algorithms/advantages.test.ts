import { describe, it, expect } from 'vitest';
import { ESTIMATORS, discountedReturns, estimator, gae, mean, perToken, rowLengths, sequenceKl, tokenRewards, whiten } from './advantages.ts';

describe('tokenRewards', () => {
  // batch 2, responseLen 2; row-major [b0t0, b0t1, b1t0, b1t1]
  const logprobs = [-1, -2, -0.5, -1];
  const refLogprobs = [-1.5, -2, -1, -0.5];
  const scores = [1, 0.5];

  it('−β·(log π − log π_ref) on every token, plus the score on each row’s last token', () => {
    // kl per token = logprobs − ref = [0.5, 0, 0.5, −0.5]
    // β = 0.25: −β·kl = [−0.125, 0, −0.125, 0.125]
    // scores on the last token of each row: index 1 += 1, index 3 += 0.5
    // rewards = [−0.125, 1, −0.125, 0.625]
    const { rewards } = tokenRewards(scores, logprobs, refLogprobs, 2, 0.25);
    expect(rewards).toBeInstanceOf(Float64Array);
    expect(Array.from(rewards)).toEqual([-0.125, 1, -0.125, 0.625]);
  });

  it('reports the KL of a sequence (sum over its tokens), averaged over sequences', () => {
    // per-sequence sums: row 0: 0.5 + 0 = 0.5; row 1: 0.5 − 0.5 = 0 → mean 0.25
    // (= mean per-token KL 0.125 × responseLen 2)
    expect(tokenRewards(scores, logprobs, refLogprobs, 2, 0.25).kl).toBe(0.25);
    // the reported KL does not depend on β
    expect(tokenRewards(scores, logprobs, refLogprobs, 2, 0).kl).toBe(0.25);
  });

  it('with β = 0 the rewards are only the scores on the last tokens', () => {
    const { rewards } = tokenRewards([0.75, -1], logprobs, refLogprobs, 2, 0);
    expect(Array.from(rewards, (x) => x + 0)).toEqual([0, 0.75, 0, -1]);
  });

  it('identical policies give KL 0; an empty batch gives KL 0', () => {
    expect(tokenRewards([1], [-1, -2, -3], [-1, -2, -3], 3, 0.1).kl).toBe(0);
    const empty = tokenRewards([], [], [], 4, 0.1);
    expect(empty.kl).toBe(0);
    expect(empty.rewards.length).toBe(0);
  });

  it('accepts Float32Array inputs (what devices send)', () => {
    const { rewards, kl } = tokenRewards(new Float32Array(scores), new Float32Array(logprobs), new Float32Array(refLogprobs), 2, 0.25);
    expect(Array.from(rewards)).toEqual([-0.125, 1, -0.125, 0.625]);
    expect(kl).toBe(0.25);
  });
});

describe('gae', () => {
  it('one row of 3, γ = 0.5, λ = 0.5 (V after the last token is 0)', () => {
    // rewards [0, 0, 1], values [0.5, 0.25, 0.75], γλ = 0.25
    // t=2: δ = 1 + 0.5·0 − 0.75 = 0.25;            A = 0.25;                        R = 0.25 + 0.75 = 1
    // t=1: δ = 0 + 0.5·0.75 − 0.25 = 0.125;        A = 0.125 + 0.25·0.25 = 0.1875;  R = 0.4375
    // t=0: δ = 0 + 0.5·0.25 − 0.5 = −0.375;        A = −0.375 + 0.25·0.1875 = −0.328125; R = 0.171875
    const { advantages, returns } = gae([0, 0, 1], [0.5, 0.25, 0.75], 3, 0.5, 0.5);
    expect(Array.from(advantages)).toEqual([-0.328125, 0.1875, 0.25]);
    expect(Array.from(returns)).toEqual([0.171875, 0.4375, 1]);
  });

  it('two rows of 2, γ = 1, λ = 0.5: rows do not leak into each other', () => {
    // row 0: rewards [1, 2], values [0.5, 1]
    //   t=1: δ = 2 + 0 − 1 = 1;        A = 1;                 R = 2
    //   t=0: δ = 1 + 1·1 − 0.5 = 1.5;  A = 1.5 + 0.5·1 = 2;   R = 2.5
    // row 1: rewards [0, −1], values [0, 0.5]
    //   t=1: δ = −1 + 0 − 0.5 = −1.5;  A = −1.5;              R = −1
    //   t=0: δ = 0 + 1·0.5 − 0 = 0.5;  A = 0.5 + 0.5·(−1.5) = −0.25; R = −0.25
    const { advantages, returns } = gae([1, 2, 0, -1], [0.5, 1, 0, 0.5], 2, 1, 0.5);
    expect(Array.from(advantages)).toEqual([2, 1, -0.25, -1.5]);
    expect(Array.from(returns)).toEqual([2.5, 2, -0.25, -1]);
  });

  it('γ = λ = 1 is Monte Carlo: returns are the rewards-to-go', () => {
    // rewards [1, 2, 3]: to-go [6, 5, 3]; A = to-go − V
    const { advantages, returns } = gae([1, 2, 3], [1, 1, 1], 3, 1, 1);
    expect(Array.from(returns)).toEqual([6, 5, 3]);
    expect(Array.from(advantages)).toEqual([5, 4, 2]);
  });

  it('λ = 0 is the one-step TD error', () => {
    // γ = 0.5: δ_t = r_t + 0.5·V_{t+1} − V_t with V_3 = 0
    // δ = [1 + 0.5·2 − 1, 0 + 0.5·4 − 2, 1 + 0 − 4] = [1, 0, −3]
    const { advantages } = gae([1, 0, 1], [1, 2, 4], 3, 0.5, 0);
    expect(Array.from(advantages)).toEqual([1, 0, -3]);
  });
});

describe('whiten', () => {
  it('[1, 2, 3, 4]: mean 2.5, population std √1.25', () => {
    // deviations [−1.5, −0.5, 0.5, 1.5]; squares sum to 5; 5/4 = 1.25; std = 1.1180340
    // out = dev / 1.1180340 = [−1.3416408, −0.4472136, 0.4472136, 1.3416408]
    // (a sample std √(5/3) = 1.2909944 would give −1.1618950 instead)
    const out = whiten([1, 2, 3, 4]);
    const expected = [-1.3416408, -0.4472136, 0.4472136, 1.3416408];
    out.forEach((x, i) => expect(x).toBeCloseTo(expected[i]!, 6));
  });

  it('gives mean 0 and population std 1', () => {
    const xs = [3, -1, 4, 1, -5, 9, 2, 6];
    const out = whiten(xs);
    const m = out.reduce((a, b) => a + b, 0) / out.length;
    const sd = Math.sqrt(out.reduce((a, b) => a + (b - m) ** 2, 0) / out.length);
    expect(m).toBeCloseTo(0, 12);
    expect(sd).toBeCloseTo(1, 7);
  });

  it('a constant input becomes zeros (eps keeps it finite)', () => {
    expect(Array.from(whiten([3, 3, 3]))).toEqual([0, 0, 0]);
  });
});

describe('mean', () => {
  it('averages, and an empty input has mean 0', () => {
    expect(mean([1, 2, 3, 4])).toBe(2.5);
    expect(mean(new Float32Array([0.5, -0.5, 1]))).toBeCloseTo(1 / 3, 12);
    expect(mean([])).toBe(0);
  });
});

describe('ragged rows: each response counts up to its own end', () => {
  // R = 3; row 0 has 2 tokens, row 1 all 3. Padded values are absurd on purpose.
  const lengths = [2, 3];

  it('tokenRewards: the KL only on real tokens, the score on each row’s last real token', () => {
    const logprobs = [-1, -2, 50, -1, -1, -1];
    const ref = [-1.5, -2, -9, -2, -1, -1];
    // kl: row 0 [0.5, 0], row 1 [1, 0, 0]; β = 0.5
    const { rewards, kl } = tokenRewards([1, 2], logprobs, ref, 3, 0.5, lengths);
    expect(Array.from(rewards)).toEqual([-0.25, 1, 0, -0.5, -0, 2]); // −β·0 is −0
    expect(kl).toBe(0.75); // (0.5 + 1) / 2
  });

  it('gae stops at each end: V after the last real token is 0, padding gets 0', () => {
    // row 0: rewards [1, 2], values [0.5, 1]; γ = λ = 1: A1 = 2 − 1 = 1, A0 = (1 + 1 − 0.5) + 1 = 2.5
    const { advantages, returns } = gae([1, 2, 99, 0, 0, 1], [0.5, 1, 99, 0, 0, 0], 3, 1, 1, lengths);
    expect(Array.from(advantages.subarray(0, 3))).toEqual([2.5, 1, 0]);
    expect(Array.from(returns.subarray(0, 3))).toEqual([3, 2, 0]);
    // γ = λ = 0.5: A1 = 1, δ0 = 1 + 0.5·1 − 0.5 = 1, A0 = 1 + 0.25·1 = 1.25
    expect(Array.from(gae([1, 2, 99], [0.5, 1, 99], 3, 0.5, 0.5, [2]).advantages)).toEqual([1.25, 1, 0]);
  });

  it('whiten over the real entries only; padding comes out 0', () => {
    // real [1, 3, 5]: mean 3, population std √(8/3)
    const out = whiten([1, 3, 99, 5], 0, [1, 1, 0, 1]);
    const s = Math.sqrt(8 / 3);
    expect(Array.from(out)).toEqual([-2 / s, 0, 0, 2 / s]);
  });

  it('sequenceKl, perToken and discountedReturns stop at each end', () => {
    expect(Array.from(sequenceKl([-1, -2, 50, -1, -1, -1], [-1.5, -2, -9, -2, -1, -1], 3, 'k1', lengths))).toEqual([0.5, 1]);
    expect(Array.from(perToken([7, -1], 3, lengths))).toEqual([7, 7, 0, -1, -1, -1]);
    expect(Array.from(discountedReturns([1, 2, 99, 1, 1, 1], 3, 1, lengths))).toEqual([3, 2, 0, 3, 2, 1]);
  });

  it('every estimator ignores what the padding holds and writes 0 there', () => {
    const base = { scores: [1, 0, 0.5, 0.25], responseLen: 3, group: 2, mask: [1, 1, 0, 1, 1, 1, 1, 0, 0, 1, 1, 0] };
    const fields = (pad: number) => {
      const fill = (xs: number[]) => xs.map((x, i) => (base.mask[i] ? x : pad));
      return {
        logprobs: fill([-1, -2, 0, -1, -1, -1, -3, 0, 0, -2, -1, 0]),
        ref: fill([-1.5, -2, 0, -2, -1, -1, -2, 0, 0, -2, -2, 0]),
        values: fill([0.5, 1, 0, 0, 0.2, 0.1, 0.3, 0, 0, 0.1, 0.4, 0]),
      };
    };
    for (const name of Object.keys(ESTIMATORS)) {
      const run = (pad: number) => estimator(name)({ ...base, ...fields(pad), baseline: [0.5, 0.5, 0.5, 0.5] }, { kl_coef: 0.1 });
      const [a, b] = [run(0), run(123)];
      expect(Array.from(b.advantages), name).toEqual(Array.from(a.advantages));
      expect(b.stats, name).toEqual(a.stats);
      base.mask.forEach((m, i) => {
        if (!m) expect(a.advantages[i], `${name} at padding ${i}`).toBe(0);
      });
    }
  });
});

describe('episodes: masks with observations between the actions, and step rewards by token', () => {
  // One row of 6 response tokens: an action (0-1), an observation (2-3), an action (4), then padding (5).
  const mask = [1, 1, 0, 0, 1, 0];
  const lp = [-1, -2, 0, 0, -0.5, 0];
  const ref = [-1.5, -1, 0, 0, -0.5, 0];

  it("a row's span runs to its last action; observations get no advantage", () => {
    expect(Array.from(rowLengths(1, 6, mask))).toEqual([5]);
    const out = ESTIMATORS.rloo!({ scores: [1, 0], logprobs: [...lp, ...lp], ref: [...ref, ...ref], responseLen: 6, group: 2, mask: [...mask, ...mask] }, { kl_coef: 0 });
    expect(Array.from(out.advantages)).toEqual([1, 1, 0, 0, 1, 0, -1, -1, 0, 0, -1, 0]);
  });

  it('step rewards stay at their tokens and the last token gets the rest of the score; none, and the score sits on the last token as before', () => {
    const step = [0, 0.25, 0, 0, 0.5, 0];
    // KL shaping −β·(lp − ref) with β = 0.1: −0.05, 0.1, 0, 0, 0; the score 2 is 0.75 of steps and 1.25 of the rest.
    const { rewards } = tokenRewards([2], lp, ref, 6, 0.1, rowLengths(1, 6, mask), step);
    expect(Array.from(rewards).map((x) => Math.round(x * 1e6) / 1e6 + 0)).toEqual([-0.05, 0.35, 0, 0, 1.75, 0]);
    const none = tokenRewards([2], lp, ref, 6, 0.1, rowLengths(1, 6, mask), new Array(6).fill(0));
    const before = tokenRewards([2], lp, ref, 6, 0.1, rowLengths(1, 6, mask));
    expect(Array.from(none.rewards)).toEqual(Array.from(before.rewards));
  });
});
