import { describe, it, expect } from 'vitest';
import { gae, mean, tokenRewards, whiten } from './advantages.ts';

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
