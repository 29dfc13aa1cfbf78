// The advantage estimators of the critic-free algorithms and DPO's statistics, on cases worked
// out by hand in the comments.
import { describe, expect, it } from 'vitest';
import { discountedReturns, estimator, groupNormalised, klOf, leaveOneOut, perToken, sequenceKl } from './advantages.ts';
import { preferenceStats } from './dpo.ts';
import { readPairsFile, taskPairs } from './pairs.ts';
import { makeTask } from '../device/task.ts';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';

const close = (got: ArrayLike<number>, want: number[], digits = 6) => {
  expect(got.length).toBe(want.length);
  want.forEach((w, i) => expect(got[i]!).toBeCloseTo(w, digits));
};

describe('KL estimators', () => {
  it('k1 = d, k2 = d²/2, k3 = e^−d − 1 + d', () => {
    expect(klOf(0.5, 'k1')).toBe(0.5);
    expect(klOf(0.5, 'k2')).toBe(0.125);
    // e^−0.5 = 0.60653066; − 1 + 0.5 = 0.10653066
    expect(klOf(0.5, 'k3')).toBeCloseTo(0.10653066, 8);
    expect(klOf(0, 'k3')).toBe(0);
    expect(klOf(-2, 'k3')).toBeGreaterThan(0);
  });

  it('sums a row over its tokens', () => {
    // rows [0.5, 0] and [0.5, −0.5] of log π − log π_ref
    close(sequenceKl([-1, -2, -0.5, -1], [-1.5, -2, -1, -0.5], 2), [0.5, 0]);
  });
});

describe('GRPO: group-normalised advantages', () => {
  it('(r − mean) / (std + ε) within each group, with the sample std', () => {
    // group [1, 0, 0, 1]: mean 0.5, sample std √((4·0.25)/3) = 0.57735 → ±0.8660
    // group [0.5, 0.5, 0.5, 0.5]: std 0 → all 0 (a flat group carries no signal)
    const { advantages, flatGroups } = groupNormalised([1, 0, 0, 1, 0.5, 0.5, 0.5, 0.5], 4);
    close(advantages, [0.866024, -0.866024, -0.866024, 0.866024, 0, 0, 0, 0], 5);
    expect(flatGroups).toBe(0.5);
  });

  it('without the division (Dr. GRPO), the mean is taken off only', () => {
    close(groupNormalised([1, 0, 0, 1], 4, false).advantages, [0.5, -0.5, -0.5, 0.5]);
  });

  it("the estimator puts a row's advantage on every token, and a KL penalty lowers the reward first", () => {
    // G = 2, R = 2. Rewards [1, 0]; KL rows (k1): [0.5, 0] → with β = 1: [0.5, 0] → advantages ±0.7071
    const out = estimator('grpo')({ scores: [1, 0], logprobs: [-1, -2, -0.5, -1], ref: [-1.5, -2, -1, -0.5], responseLen: 2, group: 2 }, { kl_coef: 1 });
    // mean 0.25, sample std √((0.0625·2)/1) = 0.35355 → (0.5 − 0.25)/0.35355 = 0.7071
    close(out.advantages, [0.707105, 0.707105, -0.707105, -0.707105], 5);
    expect(out.stats.kl).toBeCloseTo(0.25, 10);
  });
});

describe('RLOO: leave-one-out baseline', () => {
  it('each reward less the mean of the other G − 1', () => {
    // [1, 0, 0.5]: 1 − 0.25 = 0.75; 0 − 0.75 = −0.75; 0.5 − 0.5 = 0
    close(leaveOneOut([1, 0, 0.5], 3), [0.75, -0.75, 0]);
    expect(() => leaveOneOut([1], 1)).toThrow(/at least 2 samples/);
  });
});

describe('ReMax: the greedy response as the baseline', () => {
  it('reward less the greedy reward, on every token', () => {
    const out = estimator('remax')({ scores: [1, 0.25], baseline: [0.5, 0.5], logprobs: [0, 0, 0, 0], ref: [0, 0, 0, 0], responseLen: 2, group: 1 }, { kl_coef: 0.1 });
    close(out.advantages, [0.5, 0.5, -0.25, -0.25]);
    expect(out.stats.baseline_reward).toBe(0.5);
  });
});

describe('REINFORCE++', () => {
  it('suffix sums of the KL-shaped token rewards, z-scored over the whole batch', () => {
    // R = 2, β = 0: token rewards [0, 1] and [0, 0] → returns [1, 1, 0, 0] → z-scores [1, 1, −1, −1]
    close(discountedReturns([0, 1, 0, 0], 2), [1, 1, 0, 0]);
    const out = estimator('reinforce_pp')({ scores: [1, 0], logprobs: [0, 0, 0, 0], ref: [0, 0, 0, 0], responseLen: 2, group: 1 }, { kl_coef: 0 });
    close(out.advantages, [1, 1, -1, -1], 5);
  });

  it('γ discounts later rewards', () => {
    // [1, 2, 3] with γ = 0.5: 3; 2 + 1.5 = 3.5; 1 + 1.75 = 2.75
    close(discountedReturns([1, 2, 3], 3, 0.5), [2.75, 3.5, 3]);
  });
});

describe('perToken', () => {
  it('repeats each row value over its tokens', () => close(perToken([1, -2], 3), [1, 1, 1, -2, -2, -2]));
});

describe('DPO statistics', () => {
  it('the share of pairs with h(y_w) > h(y_l), and the mean margin β·(h_w − h_l)', () => {
    // R = 1, pairs: rows 0, 1 chosen; rows 2, 3 rejected. h = logp − ref = [0.5, −0.2, 0.1, 0.3]
    // pair 0: 0.5 > 0.1 right, margin 0.4; pair 1: −0.2 < 0.3 wrong, margin −0.5; β = 2 → mean −0.1
    const s = preferenceStats([0.5, -0.2, 0.1, 0.3], [0, 0, 0, 0], 1, 2);
    expect(s.accuracy).toBe(0.5);
    expect(s.margin).toBeCloseTo(-0.1, 10);
  });
});

describe('DPO pairs', () => {
  const task = makeTask('sort', 4, 10);
  it('from the task: the chosen answer scores higher under the rule, and a replay draws the same bits', () => {
    const pairs = taskPairs(task, 7, 3, 16);
    expect(pairs).toEqual(taskPairs(task, 7, 3, 16));
    const width = task.promptLen + task.responseLen;
    for (let i = 0; i < 16; i++) {
      const c = pairs.subarray(i * width, (i + 1) * width);
      const r = pairs.subarray((16 + i) * width, (17 + i) * width);
      expect(Array.from(c.subarray(0, task.promptLen))).toEqual(Array.from(r.subarray(0, task.promptLen)));
      expect(task.score(c.subarray(0, task.promptLen), c.subarray(task.promptLen))).toBeGreaterThan(task.score(r.subarray(0, task.promptLen), r.subarray(task.promptLen)));
    }
  });

  it('from a file: each line checked, with the line named in the error', () => {
    const dir = mkdtempSync(join(tmpdir(), 'pairs-'));
    const good = join(dir, 'good.jsonl');
    writeFileSync(good, `${JSON.stringify({ prompt: [3, 1, 2, 0, 10], chosen: [0, 1, 2, 3], rejected: [3, 2, 1, 0] })}\n\n`);
    const f = readPairsFile(good, task);
    expect(f.count).toBe(1);
    expect(Array.from(f.batch(1, 0, 2))).toEqual([3, 1, 2, 0, 10, 0, 1, 2, 3, 3, 1, 2, 0, 10, 0, 1, 2, 3, 3, 1, 2, 0, 10, 3, 2, 1, 0, 3, 1, 2, 0, 10, 3, 2, 1, 0]);
    const bad = join(dir, 'bad.jsonl');
    writeFileSync(bad, `${JSON.stringify({ prompt: [3, 1, 2, 0, 10], chosen: [0, 1, 2, 3], rejected: [3, 2, 1, 0] })}\n{"prompt": [1, 2]\n`);
    expect(() => readPairsFile(bad, task)).toThrow(/bad\.jsonl:2: not JSON/);
    writeFileSync(bad, `${JSON.stringify({ prompt: [3, 1, 2, 0, 10], chosen: [0, 1, 2, 99], rejected: [3, 2, 1, 0] })}\n`);
    expect(() => readPairsFile(bad, task)).toThrow(/bad\.jsonl:1: 'chosen' must be 4 token ids below 11, got \[0,1,2,99\]/);
  });
});
