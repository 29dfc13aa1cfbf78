// GSPO, CISPO and decoupled PPO on small tensors, against values worked out by hand (in the
// comments), gradients included; and decoupled PPO at π_prox = π_behav against clip_policy, bit
// for bit.
import * as tf from '@tensorflow/tfjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { initBackend } from '../backend/backend.ts';
import { AGGREGATIONS, LossError, defineLoss, evaluateLoss, lossOf, lossParams, type LossParams } from './index.ts';
import { z } from 'zod';

beforeAll(async () => {
  await initBackend('cpu');
});

const run = (name: string, pred: tf.Tensor, data: Record<string, tf.Tensor>, params: LossParams = {}) => evaluateLoss(lossOf(name), pred, data, lossParams(lossOf(name), params));
const num = (t: tf.Tensor) => t.dataSync()[0]!;
/** d loss / d pred, as an array. */
const grad = (name: string, pred: tf.Tensor, data: Record<string, tf.Tensor>, params: LossParams = {}) =>
  Array.from(
    tf
      .grad((x: tf.Tensor) => run(name, x, data, params).loss)(pred)
      .dataSync(),
  );

describe('gspo (ε = 3e-4 / 4e-4)', () => {
  // Two responses of R = 3, the first with 2 tokens (its third is padding), old log-probs 0.
  //   row 0: log-ratios 0.3, 0.1 → s₀ = exp(0.2) = 1.2214028, A₀ = 1 → min(1.2214, 1.0004) = 1.0004: clipped
  //   row 1: log-ratios 0, 0, 0.003 → s₁ = exp(0.001) = 1.0010005, A₁ = −1 → min(−1.0010005, −1.0004) = −1.0010005: not clipped
  // loss = −(1.0004 − 1.0010005)/2 = 0.00030025. The padding's log-ratio (9) and advantage (100) count nowhere.
  const pred = () => tf.tensor2d([0.3, 0.1, 9, 0, 0, 0.003], [2, 3]);
  const data = () => ({ old: tf.zeros([2, 3]), advantages: tf.tensor2d([1, 1, 100, -1, -1, -1], [2, 3]), mask: tf.tensor2d([1, 1, 0, 1, 1, 1], [2, 3]) });

  it('clips the ratio of a whole sequence, length-normalised', () => {
    const out = run('gspo', pred(), data());
    expect(num(out.loss)).toBeCloseTo(0.00030025, 7);
    // The clip fraction counts ratios outside [1 − ε, 1 + ε_high], as clip_policy's does, whichever
    // branch the minimum took: both rows here (row 1's 1.0010005 > 1.0004, though A < 0 keeps it).
    expect(num(out.stats.clipfrac!)).toBe(1);
    expect(num(out.stats.ratio_mean!)).toBeCloseTo((Math.exp(0.2) + Math.exp(0.001)) / 2, 6);
  });

  it('a clipped sequence passes no gradient; an unclipped one passes −A·s/(|o|·rows) to each of its tokens', () => {
    // row 1: −(−1)·1.0010005/(3·2) = 0.16683342 on each of its three tokens
    const g = grad('gspo', pred(), data());
    [0, 0, 0, 0.16683342, 0.16683342, 0.16683342].forEach((x, i) => expect(g[i]).toBeCloseTo(x, 6));
  });

  it('with kl_coef reads ref and adds β times each response’s mean k3, averaged over responses', () => {
    expect(lossOf('gspo').ports(lossParams(lossOf('gspo'), { kl_coef: 0.5 }))).toEqual(['old', 'advantages', 'ref']);
    // Ratio 1 and A = 0 everywhere: only the KL term. d = pred − ref = 1 on row 0's two tokens, 0 on row 1:
    // k3(1) = e⁻¹ − 1 + 1 = 0.36787944; row means 0.36787944 and 0 → 0.18393972, × β 0.5 = 0.09196986
    const zeros = () => tf.zeros([2, 3]);
    const out = run('gspo', zeros(), { old: zeros(), advantages: zeros(), ref: tf.tensor2d([-1, -1, 5, 0, 0, 0], [2, 3]), mask: tf.tensor2d([1, 1, 0, 1, 1, 1], [2, 3]) }, { kl_coef: 0.5 });
    expect(num(out.loss)).toBeCloseTo(0.09196986, 6);
  });

  it('two replicas, each dividing by the whole mini-batch’s rows, add up to the whole', () => {
    const whole = num(run('gspo', pred(), data()).loss);
    const norm = { tokens: 5, rows: 2 };
    const part = (r: number) => {
      const pick = (t: tf.Tensor) => tf.slice(t, [r, 0], [1, 3]);
      const d = data();
      return num(evaluateLoss(lossOf('gspo'), pick(pred()), { old: pick(d.old), advantages: pick(d.advantages), mask: pick(d.mask) }, lossParams(lossOf('gspo'), {}), norm).loss);
    };
    expect(part(0) + part(1)).toBeCloseTo(whole, 7);
  });
});

describe('cispo (ε_low = 1: no lower bound; ε_high = 0.28)', () => {
  // One row of four tokens, old log-probs 0: r = [1.5, 0.5, 1.2, 1], A = [1, 1, −1, 2].
  // Weights sg(clip(r, 0, 1.28)) = [1.28, 0.5, 1.2, 1]; per token −w·A·log π:
  //   −1.28·ln 1.5 = −0.51899533, −0.5·ln 0.5 = 0.34657359, 1.2·ln 1.2 = 0.21878592, −2·ln 1 = 0
  // loss = (−0.51899533 + 0.34657359 + 0.21878592)/4 = 0.01159105
  const r = [1.5, 0.5, 1.2, 1];
  const pred = () => tf.tensor2d(r.map(Math.log), [1, 4]);
  const data = () => ({ old: tf.zeros([1, 4]), advantages: tf.tensor2d([1, 1, -1, 2], [1, 4]) });

  it('weights each token’s log-probability by its clipped ratio', () => {
    const out = run('cispo', pred(), data());
    expect(num(out.loss)).toBeCloseTo(0.01159105, 6);
    // Only the first token's ratio is outside [0, 1.28].
    expect(num(out.stats.clipfrac!)).toBe(0.25);
  });

  it('the weight carries no gradient: every token, clipped or not, passes −w·A/N', () => {
    // [−1.28·1, −0.5·1, −1.2·(−1), −1·2]/4 = [−0.32, −0.125, 0.3, −0.5]. Were the weight differentiated
    // too, the unclipped tokens would also get −r·A·log π/N (token 2: −0.5·ln 0.5/4 = 0.0866 more).
    const g = grad('cispo', pred(), data());
    [-0.32, -0.125, 0.3, -0.5].forEach((x, i) => expect(g[i]).toBeCloseTo(x, 6));
  });
});

describe('decoupled PPO', () => {
  // One row of three tokens: π_θ/π_prox = u = [1.1, 1, 0.7] (prox 0), π_prox/π_behav = w = [2, 8, 1]
  // (behav = [ln ½, ln ⅛, 0]); the cap 5 drops the second token (weight 0). A = [1, 1, −1], ε = 0.2.
  //   −min(u·A, clip(u)·A) = [−1.1, −1, 0.8] (the third clipped: min(−0.7, −0.8)); weighted [−2.2, 0, 0.8]
  // loss = −1.4/3 = −0.46666667; weight_mean (2 + 0 + 1)/3 = 1; capped 1/3; clipfrac 1/3 (u = 0.7).
  const pred = () => tf.tensor2d([Math.log(1.1), 0, Math.log(0.7)], [1, 3]);
  const data = () => ({ prox: tf.zeros([1, 3]), behav: tf.tensor2d([Math.log(0.5), Math.log(0.125), 0], [1, 3]), advantages: tf.tensor2d([1, 1, -1], [1, 3]) });

  it('clips against the proximal policy and weights by π_prox/π_behav, dropping a weight over the cap', () => {
    const out = run('decoupled', pred(), data());
    expect(num(out.loss)).toBeCloseTo(-1.4 / 3, 6);
    expect(num(out.stats.weight_mean!)).toBeCloseTo(1, 6);
    expect(num(out.stats.capped!)).toBeCloseTo(1 / 3, 6);
    expect(num(out.stats.clipfrac!)).toBeCloseTo(1 / 3, 6);
    // Gradients: token 0 −w·u·A/3 = −2·1.1/3; token 1 weight 0; token 2 clipped.
    const g = grad('decoupled', pred(), data());
    [(-2 * 1.1) / 3, 0, 0].forEach((x, i) => expect(g[i]).toBeCloseTo(x, 6));
  });

  it('with π_behav = π_prox it is clip_policy exactly: loss and gradient, bit for bit, for every variant', () => {
    const pred = () => tf.tensor2d([0.2, -0.5, 0.1, -0.05, 0.3, 9, 0.01, -0.2], [2, 4]);
    const prox = () => tf.tensor2d([0, -0.4, 0.35, 0, 0.1, 0, 0, 0.05], [2, 4]);
    const common = () => ({
      advantages: tf.tensor2d([1, -2, 0.5, 1, -1, 7, 3, -0.5], [2, 4]),
      ref: tf.tensor2d([0.1, 0, -0.3, 0.2, 0, 0, 0.05, 0], [2, 4]),
      mask: tf.tensor2d([1, 1, 1, 1, 1, 0, 1, 1], [2, 4]),
    });
    for (const aggregation of AGGREGATIONS) {
      for (const extra of [{}, { clip_high: 0.28 }, { kl_coef: 0.1, kl: 'k2' }] as LossParams[]) {
        const params = { clip: 0.2, aggregation, ...extra };
        const clip = run('clip_policy', pred(), { ...common(), old: prox() }, params);
        const decoupled = run('decoupled', pred(), { ...common(), prox: prox(), behav: prox() }, params);
        expect(decoupled.loss.dataSync()[0], `${aggregation} ${JSON.stringify(extra)}`).toBe(clip.loss.dataSync()[0]);
        expect(decoupled.stats.clipfrac!.dataSync()[0]).toBe(clip.stats.clipfrac!.dataSync()[0]);
        expect(grad('decoupled', pred(), { ...common(), prox: prox(), behav: prox() }, params)).toEqual(grad('clip_policy', pred(), { ...common(), old: prox() }, params));
      }
    }
  });
});

describe('defineLoss and evaluateLoss refuse what a loss cannot be, naming it', () => {
  const base = { summary: 'a test loss', head: 'policy' as const, params: z.strictObject({}), ports: [] as string[] };

  it('a bad name, a statistic named like the loss', () => {
    expect(() => defineLoss({ ...base, name: 'has space', compute: ({ pred }) => ({ loss: tf.sum(pred) }) })).toThrow(/defineLoss\("has space"\): a loss's name is a letter/);
    expect(() => defineLoss({ ...base, name: 'ok', stats: ['loss'], compute: ({ pred }) => ({ loss: tf.sum(pred) }) })).toThrow(/'loss' is not a statistic's name/);
  });

  it('a loss that is not a scalar, an undeclared statistic, a declared one missing, a loss that throws', () => {
    const pred = () => tf.zeros([1, 2]);
    const vector = defineLoss({ ...base, name: 'vector', compute: ({ pred }) => ({ loss: tf.sum(pred, 1) as unknown as tf.Scalar }) });
    expect(() => evaluateLoss(vector, pred(), {}, {})).toThrow(LossError);
    expect(() => evaluateLoss(vector, pred(), {}, {})).toThrow("the loss 'vector' returned a loss of shape [1]; expected a scalar (reduce it, e.g. with tf.sum(...) / norm.tokens)");
    const chatty = defineLoss({ ...base, name: 'chatty', compute: ({ pred }) => ({ loss: tf.sum(pred), stats: { extra: tf.scalar(1) } }) });
    expect(() => evaluateLoss(chatty, pred(), {}, {})).toThrow("the loss 'chatty' reported the statistic 'extra', which it does not declare (stats: [])");
    const quiet = defineLoss({ ...base, name: 'quiet', stats: ['clipfrac'], compute: ({ pred }) => ({ loss: tf.sum(pred) }) });
    expect(() => evaluateLoss(quiet, pred(), {}, {})).toThrow("the loss 'quiet' declares the statistic 'clipfrac' but returned nothing; expected a scalar tensor");
    const thrower = defineLoss({
      ...base,
      name: 'thrower',
      compute: () => {
        throw new RangeError('no');
      },
    });
    expect(() => evaluateLoss(thrower, pred(), {}, {})).toThrow("the loss 'thrower' failed: no");
  });
});
