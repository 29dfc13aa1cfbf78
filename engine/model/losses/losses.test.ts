import { describe, it, expect, beforeAll } from 'vitest';
import * as tf from '@tensorflow/tfjs';
import { initBackend } from '../backend/backend.ts';
import { AGGREGATIONS, LossError, evaluateLoss, itemRows, lossOf, lossParams, policyLoss, valueLoss, type LossNorm, type LossParams } from './index.ts';

beforeAll(async () => {
  await initBackend('cpu');
});

const scalar = (t: tf.Scalar) => {
  const x = t.dataSync()[0]!;
  t.dispose();
  return x;
};

describe('policyLoss (clip ε = 0.2)', () => {
  // Six tokens as [2, 3]; old log-probs 0, so ratio r = exp(logp).
  //   token  r    A    r·A    clip(r)·A        min     what happens
  //   1      1.5  +1   1.5    1.2·1 = 1.2      1.2     clipped above (positive A)
  //   2      0.5  +1   0.5    0.8·1 = 0.8      0.5     below 1−ε but A > 0: not clipped
  //   3      0.5  −1   −0.5   0.8·(−1) = −0.8  −0.8    clipped below (negative A)
  //   4      1.5  −1   −1.5   1.2·(−1) = −1.2  −1.5    above 1+ε but A < 0: not clipped
  //   5      1.1  +2   2.2    1.1·2 = 2.2      2.2     inside the range
  //   6      1    0    0      0                0
  // loss = −mean(min) = −(1.2 + 0.5 − 0.8 − 1.5 + 2.2 + 0)/6 = −1.6/6 = −0.2666667
  const r = [1.5, 0.5, 0.5, 1.5, 1.1, 1];
  const A = [1, 1, -1, -1, 2, 0];
  const logp = () => tf.tensor2d(r.map(Math.log), [2, 3]);
  const old = () => tf.zeros([2, 3]);
  const adv = () => tf.tensor2d(A, [2, 3]);

  it('matches the hand-computed value with clipping active on both sides', () => {
    expect(scalar(policyLoss(logp(), old(), adv(), 0.2))).toBeCloseTo(-1.6 / 6, 5);
  });

  it('uses the ratio exp(logp − old), not logp itself', () => {
    // shifting both logp and old by the same amount changes nothing
    const shift = tf.scalar(-3);
    const value = policyLoss(tf.add(logp(), shift), tf.add(old(), shift), adv(), 0.2);
    expect(scalar(value)).toBeCloseTo(-1.6 / 6, 5);
  });

  it('a clipped token passes no gradient; an unclipped one passes −r·A/N', () => {
    // d loss / d logp_i = −(1/6)·r_i·A_i where the unclipped term is the minimum, else 0:
    // [0, −0.5/6, 0, +1.5/6, −2.2/6, 0] = [0, −0.0833333, 0, 0.25, −0.3666667, 0]
    const g = tf.grad((x: tf.Tensor) => policyLoss(x, old(), adv(), 0.2))(logp());
    const expected = [0, -0.5 / 6, 0, 1.5 / 6, -2.2 / 6, 0];
    Array.from(g.dataSync()).forEach((x, i) => expect(x).toBeCloseTo(expected[i]!, 5));
    g.dispose();
  });

  it('with ratio 1 everywhere it is −mean(A)', () => {
    // −(1 + 1 − 1 − 1 + 2 + 0)/6 = −2/6
    expect(scalar(policyLoss(old(), old(), adv(), 0.2))).toBeCloseTo(-2 / 6, 6);
  });

  it('a wider clip lets token 1 and 3 through', () => {
    // ε = 0.6: clip range [0.4, 1.6] contains every ratio, so min = r·A everywhere:
    // −(1.5 + 0.5 − 0.5 − 1.5 + 2.2 + 0)/6 = −2.2/6
    expect(scalar(policyLoss(logp(), old(), adv(), 0.6))).toBeCloseTo(-2.2 / 6, 5);
  });

  it('leaks no tensors', () => {
    const [a, b, c] = [logp(), old(), adv()];
    const before = tf.memory().numTensors;
    scalar(policyLoss(a, b, c, 0.2));
    expect(tf.memory().numTensors).toBe(before);
    tf.dispose([a, b, c]);
  });
});

describe('valueLoss (clip ε = 0.2)', () => {
  //   V    V_old  R    V−V_old → clipped   V_clip   (V−R)²   (V_clip−R)²   max
  //   1.0  0.5    1.0  +0.5 → +0.2         0.7      0        0.09          0.09   clipped above
  //   0.0  0.5    0.0  −0.5 → −0.2         0.3      0        0.09          0.09   clipped below
  //   0.6  0.5    1.0  +0.1                0.6      0.16     0.16          0.16   inside
  //   1.0  0.5    0.0  +0.5 → +0.2         0.7      1        0.49          1      unclipped is worse
  // loss = ½·mean = ½·(0.09 + 0.09 + 0.16 + 1)/4 = ½·0.335 = 0.1675
  const V = () => tf.tensor2d([1, 0, 0.6, 1], [2, 2]);
  const Vold = () => tf.fill([2, 2], 0.5);
  const R = () => tf.tensor2d([1, 0, 1, 0], [2, 2]);

  it('matches the hand-computed value with clipping active on both sides', () => {
    expect(scalar(valueLoss(V(), Vold(), R(), 0.2))).toBeCloseTo(0.1675, 5);
  });

  it('without clipping in play it is ½·MSE', () => {
    // ε = 1 contains every change: ½·(0 + 0 + 0.16 + 1)/4 = 0.145
    expect(scalar(valueLoss(V(), Vold(), R(), 1))).toBeCloseTo(0.145, 5);
  });

  it('gradients: the clipped branch passes none', () => {
    // d/dV of ½·mean(max(a, b)), N = 4:
    //   token 1: max is b (clipped, constant in V) → 0
    //   token 2: same → 0
    //   token 3: a = b = 0.16, both with slope ½·2·(0.6 − 1)/4 = −0.1
    //   token 4: max is a: ½·2·(1 − 0)/4 = 0.25
    const g = tf.grad((x: tf.Tensor) => valueLoss(x, Vold(), R(), 0.2))(V());
    const out = Array.from(g.dataSync());
    g.dispose();
    expect(out[0]).toBeCloseTo(0, 6);
    expect(out[1]).toBeCloseTo(0, 6);
    expect(out[3]).toBeCloseTo(0.25, 5);
    // On the tie, either branch has the same slope: clip(V − V_old) is the identity inside the range.
    expect(out[2]).toBeCloseTo(-0.1, 5);
  });
});

/** The named loss of the registry on a mini-batch, its parameters parsed as a train call's are. */
const evaluated = (name: string, pred: tf.Tensor, data: Record<string, tf.Tensor>, params: LossParams, norm?: LossNorm) =>
  evaluateLoss(lossOf(name), pred, data, lossParams(lossOf(name), params), norm);
const lossT = (name: string, pred: tf.Tensor, data: Record<string, tf.Tensor>, params: LossParams, norm?: LossNorm) => evaluated(name, pred, data, params, norm).loss;
/** The clip fraction a loss reports: the share of the real tokens it clipped. */
const clipfrac = (name: string, pred: tf.Tensor, data: Record<string, tf.Tensor>, params: LossParams) => scalar(evaluated(name, pred, data, params).stats.clipfrac!);

/** The named loss of the registry on these tensors (they are disposed), as a number. */
function named(name: string, pred: tf.Tensor, data: Record<string, tf.Tensor>, params: LossParams): number {
  const x = scalar(lossT(name, pred, data, params));
  tf.dispose([pred, ...Object.values(data)]);
  return x;
}

describe("the registry's clip_policy", () => {
  // The table of policyLoss above: r = [1.5, 0.5, 0.5, 1.5, 1.1, 1], A = [1, 1, −1, −1, 2, 0], old 0.
  const r = [1.5, 0.5, 0.5, 1.5, 1.1, 1];
  const A = [1, 1, -1, -1, 2, 0];
  const ports = () => ({ old: tf.zeros([2, 3]), advantages: tf.tensor2d(A, [2, 3]) });
  const logp = () => tf.tensor2d(r.map(Math.log), [2, 3]);

  it('with clip alone is policyLoss: −1.6/6', () => {
    expect(named('clip_policy', logp(), ports(), { clip: 0.2 })).toBeCloseTo(-1.6 / 6, 5);
    expect(lossOf('clip_policy').ports({ clip: 0.2 })).toEqual(['old', 'advantages']);
    expect(lossOf('clip_policy').head).toBe('policy');
  });

  it('clip_high ≠ clip clips above at 1 + clip_high and below at 1 − clip', () => {
    // ε_low = 0.2, ε_high = 0.4: the range is [0.8, 1.4].
    //   token  r    A    r·A    clip(r)·A          min
    //   1      1.5  +1   1.5    1.4·1 = 1.4        1.4    clipped above at 1.4 (not 1.2)
    //   2      0.5  +1   0.5    0.8·1 = 0.8        0.5
    //   3      0.5  −1   −0.5   0.8·(−1) = −0.8    −0.8   clipped below at 0.8, as before
    //   4      1.5  −1   −1.5   1.4·(−1) = −1.4    −1.5
    //   5      1.1  +2   2.2    2.2                2.2
    //   6      1    0    0      0                  0
    // loss = −(1.4 + 0.5 − 0.8 − 1.5 + 2.2 + 0)/6 = −1.8/6 = −0.3
    expect(named('clip_policy', logp(), ports(), { clip: 0.2, clip_high: 0.4 })).toBeCloseTo(-0.3, 5);
    // a lower bound that moves, with the upper one fixed: ε_low = 0.6, ε_high = 0.2, range [0.4, 1.2]:
    // token 3 is now inside (−0.5 instead of −0.8), token 1 still clipped at 1.2:
    // −(1.2 + 0.5 − 0.5 − 1.5 + 2.2 + 0)/6 = −1.9/6
    expect(named('clip_policy', logp(), ports(), { clip: 0.6, clip_high: 0.2 })).toBeCloseTo(-1.9 / 6, 5);
  });

  it('kl_coef > 0 adds kl_coef · mean(k3) over the tokens, and reads ref', () => {
    // Two tokens [1, 2]; old = logp, so r = 1 and the surrogate is −mean(A) = −(1 + 3)/2 = −2.
    // logp = [−1, −1], ref = [−2, 0]: d = logp − ref = [1, −1]
    //   k3(1)  = e^−1 − 1 + 1 = 0.3678794
    //   k3(−1) = e^1 − 1 − 1  = 0.7182818
    //   mean = 0.5430806; × kl_coef 0.5 = 0.2715403
    // loss = −2 + 0.2715403 = −1.7284597
    const logp = () => tf.tensor2d([-1, -1], [1, 2]);
    const data = () => ({ old: tf.tensor2d([-1, -1], [1, 2]), advantages: tf.tensor2d([1, 3], [1, 2]), ref: tf.tensor2d([-2, 0], [1, 2]) });
    expect(named('clip_policy', logp(), data(), { clip: 0.2, kl_coef: 0.5 })).toBeCloseTo(-1.7284597, 5);
    expect(named('clip_policy', logp(), data(), { clip: 0.2, kl_coef: 0.5, kl: 'k3' })).toBeCloseTo(-1.7284597, 5);
    // the other estimators: k1 = mean(d) = 0 → −2; k2 = mean(½d²) = ½ → −2 + 0.5·0.5 = −1.75
    expect(named('clip_policy', logp(), data(), { clip: 0.2, kl_coef: 0.5, kl: 'k1' })).toBeCloseTo(-2, 5);
    expect(named('clip_policy', logp(), data(), { clip: 0.2, kl_coef: 0.5, kl: 'k2' })).toBeCloseTo(-1.75, 5);
    expect(lossOf('clip_policy').ports({ clip: 0.2, kl_coef: 0.5 })).toEqual(['old', 'advantages', 'ref']);
  });

  it('the k3 term has gradient kl_coef · (1 − e^−d)/N per token', () => {
    // d/dlogp of k3 = −e^−d + 1; at d = [1, −1]: [1 − 0.3678794, 1 − 2.7182818] = [0.6321206, −1.7182818]
    // × kl_coef 0.5 / N 2 = [0.1580302, −0.4295705]; the surrogate adds −A/N = [−0.5, −1.5] (r = 1, unclipped)
    // total: [−0.3419698, −1.9295705]
    const old = tf.tensor2d([-1, -1], [1, 2]);
    const adv = tf.tensor2d([1, 3], [1, 2]);
    const ref = tf.tensor2d([-2, 0], [1, 2]);
    const g = tf.grad((x: tf.Tensor) => lossT('clip_policy', x, { old, advantages: adv, ref }, { clip: 0.2, kl_coef: 0.5 }))(tf.tensor2d([-1, -1], [1, 2]));
    const out = Array.from(g.dataSync());
    tf.dispose([g, old, adv, ref]);
    expect(out[0]).toBeCloseTo(-0.3419698, 5);
    expect(out[1]).toBeCloseTo(-1.9295705, 5);
  });

  it('aggregations: token_mean, seq_mean_token_mean and seq_mean_token_sum_norm', () => {
    // Per-token loss −min(…) of the table, as rows of R = 3:
    //   row 0: [−1.2, −0.5, 0.8]  sum −0.9  mean −0.3
    //   row 1: [1.5, −2.2, 0]     sum −0.7  mean −0.2333333
    // token_mean:               (−0.9 − 0.7)/6                = −0.2666667
    // seq_mean_token_mean:      (−0.3 − 0.2333333)/2          = −0.2666667
    // seq_mean_token_sum_norm:  (−0.9/3 − 0.7/3)/2 (Dr. GRPO) = −0.2666667
    // Every response has the full length R, so the three agree here; they part with ragged rows.
    for (const aggregation of AGGREGATIONS) {
      expect(named('clip_policy', logp(), ports(), { clip: 0.2, aggregation }), aggregation).toBeCloseTo(-1.6 / 6, 5);
    }
  });

  it('aggregations with a KL term: the mean per row, then over rows', () => {
    // Rows of R = 2, r = 1 (old = logp), A = 0: the per-token loss is kl_coef·k1 = d.
    //   d = logp − ref = [[1, 3], [−2, 0]]: row sums 4, −2; row means 2, −1
    //   token_mean = (4 − 2)/4 = 0.5; seq_mean_token_mean = (2 − 1)/2 = 0.5;
    //   seq_mean_token_sum_norm = (4/2 − 2/2)/2 = 0.5
    const data = () => ({ old: tf.zeros([2, 2]), advantages: tf.zeros([2, 2]), ref: tf.tensor2d([-1, -3, 2, 0], [2, 2]) });
    for (const aggregation of AGGREGATIONS) {
      expect(named('clip_policy', tf.zeros([2, 2]), data(), { clip: 0.2, kl_coef: 1, kl: 'k1', aggregation }), aggregation).toBeCloseTo(0.5, 5);
    }
  });

  it('fills a missing clip with its default (0.2); refuses a wrong type, an unknown key, aggregation or estimator', () => {
    expect(named('clip_policy', logp(), ports(), {})).toBeCloseTo(-1.6 / 6, 5);
    expect(() => named('clip_policy', logp(), ports(), { clip: '0.2' })).toThrow(LossError);
    expect(() => named('clip_policy', logp(), ports(), { clip: '0.2' })).toThrow(/^the loss 'clip_policy': clip: .*expected number, received string/);
    expect(() => named('clip_policy', logp(), ports(), { clip: 0.2, clipp: 0.3 })).toThrow(/the loss 'clip_policy': .*clipp/);
    expect(() => named('clip_policy', logp(), ports(), { clip: 0.2, aggregation: 'sum' })).toThrow(/the loss 'clip_policy': aggregation: .*token_mean/);
    const withRef = () => ({ ...ports(), ref: tf.zeros([2, 3]) });
    expect(() => named('clip_policy', logp(), withRef(), { clip: 0.2, kl_coef: 0.1, kl: 'k4' })).toThrow(/the loss 'clip_policy': kl: .*k3/);
  });

  it('counts the tokens whose ratio is outside [1 − clip, 1 + clip]', () => {
    // |r − 1| = [0.5, 0.5, 0.5, 0.5, 0.1, 0] > 0.2 for the first four
    const [p, d] = [logp(), ports()];
    expect(clipfrac('clip_policy', p, d, { clip: 0.2 })).toBeCloseTo(4 / 6, 6);
    tf.dispose([p, ...Object.values(d)]);
  });
});

describe("the registry's clip_value", () => {
  it('is valueLoss with params.clip, reading old and returns', () => {
    // the table of valueLoss above: 0.1675
    const data = { old: tf.fill([2, 2], 0.5), returns: tf.tensor2d([1, 0, 1, 0], [2, 2]) };
    expect(named('clip_value', tf.tensor2d([1, 0, 0.6, 1], [2, 2]), data, { clip: 0.2 })).toBeCloseTo(0.1675, 5);
    expect(lossOf('clip_value').ports({ clip: 0.2 })).toEqual(['old', 'returns']);
    expect(lossOf('clip_value').head).toBe('value');
  });
});

describe("the registry's dpo", () => {
  // Four rows of R = 2: the chosen rows 0, 1, then the rejected rows 2, 3 (item i: rows i and 2 + i).
  //   row  logp        ref           Σ(logp − ref) = h
  //   0    [−1, −1]    [−1.5, −1]    0.5     chosen of item 0
  //   1    [−2, −1]    [−1, −1]      −1      chosen of item 1
  //   2    [−3, −1]    [−2, −2]      0       rejected of item 0
  //   3    [−1, −1]    [−1, −1]      0       rejected of item 1
  // margins h_w − h_l: item 0: 0.5 − 0 = 0.5; item 1: −1 − 0 = −1
  // β = 2: softplus(−2·0.5) = ln(1 + e^−1) = 0.3132617; softplus(−2·(−1)) = ln(1 + e^2) = 2.1269280
  // loss = (0.3132617 + 2.1269280)/2 = 1.2200948
  // (Read as interleaved pairs (0,1), (2,3) it would be (softplus(−3) + softplus(0))/2 = 0.3709: the order matters.)
  const logp = () => tf.tensor2d([-1, -1, -2, -1, -3, -1, -1, -1], [4, 2]);
  const ref = () => tf.tensor2d([-1.5, -1, -1, -1, -2, -2, -1, -1], [4, 2]);

  it('is mean softplus(−β·(h_w − h_l)) over chosen-then-rejected rows', () => {
    expect(named('pair_sigmoid', logp(), { ref: ref() }, { beta: 2 })).toBeCloseTo(1.2200948, 5);
    expect(lossOf('pair_sigmoid').ports({ beta: 2 })).toEqual(['ref']);
    expect(lossOf('pair_sigmoid').rowsPerItem).toBe(2);
    expect(lossOf('pair_sigmoid').head).toBe('policy');
  });

  it('at the reference it is ln 2 whatever β', () => {
    expect(named('pair_sigmoid', logp(), { ref: logp() }, { beta: 0.1 })).toBeCloseTo(Math.LN2, 6);
    expect(named('pair_sigmoid', logp(), { ref: logp() }, { beta: 5 })).toBeCloseTo(Math.LN2, 6);
  });

  it('gradient: −β·σ(−β·margin)/n on each chosen token, the opposite on each rejected one', () => {
    // n = 2 items; σ(−1) = 0.2689414 (item 0), σ(2) = 0.8807971 (item 1); β/n = 1
    //   row 0: −0.2689414 ×2, row 1: −0.8807971 ×2, row 2: +0.2689414 ×2, row 3: +0.8807971 ×2
    const r = ref();
    const g = tf.grad((x: tf.Tensor) => lossT('pair_sigmoid', x, { ref: r }, { beta: 2 }))(logp());
    const out = Array.from(g.dataSync());
    tf.dispose([g, r]);
    const expected = [-0.2689414, -0.2689414, -0.8807971, -0.8807971, 0.2689414, 0.2689414, 0.8807971, 0.8807971];
    out.forEach((x, i) => expect(x).toBeCloseTo(expected[i]!, 5));
  });

  it('clips nothing, and needs beta', () => {
    const [p, r] = [logp(), ref()];
    expect(evaluated('pair_sigmoid', p, { ref: r }, { beta: 2 }).stats).toEqual({});
    tf.dispose([p, r]);
    expect(() => named('pair_sigmoid', logp(), { ref: ref() }, {})).toThrow(/^the loss 'pair_sigmoid': beta: .*expected number, received undefined/);
  });
});

describe('lossOf and itemRows', () => {
  it('an unknown loss is a LossError that lists the known ones', () => {
    expect(() => lossOf('ppo')).toThrow(LossError);
    expect(() => lossOf('ppo')).toThrow(/^unknown loss 'ppo'; known: clip_policy, clip_value, pair_sigmoid, gspo, cispo, decoupled/);
  });

  it('items to rows: themselves for single rows; chosen rows, then rejected rows, for pairs', () => {
    // 3 items of pairs: item i is rows i and 3 + i, so items [0, 2] are rows [0, 2] then [3, 5]
    expect(itemRows([0, 2], 3, 2)).toEqual([0, 2, 3, 5]);
    expect(itemRows([0, 2], 3, 1)).toEqual([0, 2]);
    expect(itemRows([], 3, 2)).toEqual([]);
  });
});

describe('masks: ragged mini-batches (2 rows, R = 3; row 0 has 2 tokens, row 1 has 1)', () => {
  const mask = () => tf.tensor2d([1, 1, 0, 1, 0, 0], [2, 3]);
  const zeros = () => tf.zeros([2, 3]);
  // Ratio 1 everywhere, so every token's loss is −A; the padded advantages are absurd on purpose.
  const adv = (pad = 1000) => tf.tensor2d([1, 2, pad, 4, pad, pad], [2, 3]);
  const policy = (aggregation: string, pad?: number) => scalar(lossT('clip_policy', zeros(), { old: zeros(), advantages: adv(pad), mask: mask() }, { clip: 0.2, aggregation }));

  it('token_mean: −(1 + 2 + 4)/3 over the three real tokens', () => {
    expect(policy('token_mean')).toBeCloseTo(-7 / 3, 6);
  });

  it('seq_mean_token_mean: each row over its own length, −((1 + 2)/2 + 4/1)/2', () => {
    expect(policy('seq_mean_token_mean')).toBeCloseTo(-2.75, 6);
  });

  it('seq_mean_token_sum_norm: each row’s sum over the budget R, −(3/3 + 4/3)/2', () => {
    expect(policy('seq_mean_token_sum_norm')).toBeCloseTo(-7 / 6, 6);
  });

  it('padding changes nothing: not the value, and it gets no gradient', () => {
    for (const how of AGGREGATIONS) expect(policy(how, -55)).toBeCloseTo(policy(how, 1000), 6);
    const g = tf.grad((x: tf.Tensor) => lossT('clip_policy', x, { old: zeros(), advantages: adv(), mask: mask() }, { clip: 0.2 }))(zeros());
    // d/dlogp of −r·A/3 at r = 1 is −A/3 on real tokens, 0 on padding.
    const got = Array.from(g.dataSync());
    [-1 / 3, -2 / 3, 0, -4 / 3, 0, 0].forEach((want, i) => expect(got[i]).toBeCloseTo(want, 6));
  });

  it('parts of a mini-batch divided by the whole mini-batch’s totals add up to its loss', () => {
    const norm = { tokens: 3, rows: 2 };
    for (const aggregation of AGGREGATIONS) {
      const part = (row: number) => {
        const pick = (t: tf.Tensor) => tf.slice(t, [row, 0], [1, 3]);
        return scalar(lossT('clip_policy', pick(zeros()), { old: pick(zeros()), advantages: pick(adv()), mask: pick(mask()) }, { clip: 0.2, aggregation }, norm));
      };
      expect(part(0) + part(1)).toBeCloseTo(policy(aggregation), 6);
    }
  });

  it('the clip fraction counts only real tokens: ratio 1.5 everywhere clips 3 of 3, not 6 of 6 or 3 of 6', () => {
    const p = tf.fill([2, 3], Math.log(1.5));
    expect(clipfrac('clip_policy', p, { old: zeros(), advantages: adv(), mask: mask() }, { clip: 0.2 })).toBe(1);
    expect(clipfrac('clip_value', tf.fill([2, 3], 1), { old: zeros(), returns: zeros(), mask: mask() }, { clip: 0.2 })).toBe(1);
    // Half the real tokens clipped: row 0's two (ratio 1.5), not row 1's one (ratio 1), and padding never counts.
    const half = tf.tensor2d([Math.log(1.5), Math.log(1.5), 9, 0, 9, 9], [2, 3]);
    expect(clipfrac('clip_policy', half, { old: zeros(), advantages: adv(), mask: mask() }, { clip: 0.2 })).toBeCloseTo(2 / 3, 6);
  });

  it('clip_value: ½·(1² + 2² + 4²)/3 over the real tokens', () => {
    const v = tf.tensor2d([1, 2, 50, 4, 60, 70], [2, 3]);
    expect(scalar(lossT('clip_value', v, { old: v, returns: zeros(), mask: mask() }, { clip: 0.2 }))).toBeCloseTo(3.5, 5);
  });

  it('pair_sigmoid sums each response’s own tokens: h_w = 1 + 1, h_l = 0, loss softplus(−2)', () => {
    const pred = tf.tensor2d([1, 1, 1000, 0, 0, 0], [2, 3]); // chosen, then rejected
    const m = tf.tensor2d([1, 1, 0, 1, 1, 1], [2, 3]);
    expect(scalar(lossT('pair_sigmoid', pred, { ref: zeros(), mask: m }, { beta: 1 }))).toBeCloseTo(Math.log(1 + Math.exp(-2)), 6);
  });
});
