// CISPO (MiniMax-M1, 2025): every token keeps its gradient; only the importance weight is
// clipped, and held constant: loss = −Σ_t sg(clip(r_t, 1−ε_low, 1+ε_high))·A_t·log π_θ(o_t), over
// the batch's tokens. The paper sets no lower bound in practice (ε_low = 1 here: the weight stays
// ≥ 0) and tunes ε_high.
import * as tf from '@tensorflow/tfjs';
import { z } from 'zod';
import { klParams, withRef } from './clip-policy.ts';
import { defineLoss, stopGradient } from './define.ts';
import { AGGREGATIONS, aggregate, klTensor, outsideClip, tokenShare } from './reduce.ts';

export const cispo = defineLoss({
  name: 'cispo',
  summary: 'REINFORCE with a clipped, stop-gradient importance weight: −sg(clip(r, 1−ε_low, 1+ε_high))·A·log π',
  head: 'policy',
  params: z.strictObject({
    clip: z.number().positive().default(1).describe('ε_low of the weight (1: no lower bound, as the paper)'),
    clip_high: z.number().positive().default(0.28).describe('ε_high of the weight, the one the paper tunes'),
    aggregation: z.enum(AGGREGATIONS).default('token_mean').describe("the paper divides by the batch's tokens"),
    ...klParams,
  }),
  ports: (p) => withRef(['old', 'advantages'], p),
  stats: ['clipfrac'],
  compute({ pred, data, mask, norm, params: p }) {
    const ratio = tf.exp(tf.sub(stopGradient(pred), data.old!));
    const weight = tf.clipByValue(ratio, 1 - p.clip, 1 + p.clip_high); // no gradient: built from sg(log π)
    let perToken = tf.neg(tf.mul(tf.mul(weight, data.advantages!), pred));
    if (p.kl_coef > 0) perToken = tf.add(perToken, tf.mul(p.kl_coef, klTensor(pred, data.ref!, p.kl)));
    return { loss: aggregate(perToken, p.aggregation, mask, norm), stats: { clipfrac: tokenShare(outsideClip(ratio, p.clip, p.clip_high), mask, norm) } };
  },
});
