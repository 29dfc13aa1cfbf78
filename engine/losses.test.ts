import { describe, it, expect, beforeAll } from 'vitest';
import * as tf from '@tensorflow/tfjs';
import { initBackend } from './backend.ts';
import { policyLoss, valueLoss } from './losses.ts';

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
