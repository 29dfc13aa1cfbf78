// The decoupled clipped loss (AReaL, arXiv 2505.24298) for rollouts a stale policy sampled. Two
// policies play the role π_old plays alone in the clipped loss: π_behav sampled the tokens (`behav`), π_prox is the trainer's
// policy before this update (`prox`, an inference call). The ratio is clipped against π_prox and
// the token weighted by π_prox/π_behav, held constant; a token whose weight passes the cap is
// dropped (AReaL). Per token: −w·min(u·A, clip(u, 1−ε, 1+ε_high)·A), u = π_θ/π_prox. When
// π_prox = π_behav every weight is 1, and the loss is clip_policy's exactly.
import * as tf from '@tensorflow/tfjs';
import { z } from 'zod';
import { klParams, withRef } from './clip-policy.ts';
import { defineLoss } from './define.ts';
import { AGGREGATIONS, aggregate, clippedSurrogate, klTensor, outsideClip, tokenMean, tokenShare } from './reduce.ts';

export const decoupled = defineLoss({
  name: 'decoupled',
  summary: 'decoupled clipped loss: clip against the proximal policy, weight by π_prox/π_behav (capped) for stale rollouts',
  head: 'policy',
  params: z.strictObject({
    clip: z.number().positive().default(0.2).describe('ε of the ratio to the proximal policy'),
    clip_high: z.number().positive().optional().describe('ε_high; defaults to clip'),
    cap: z.number().positive().default(5).describe('a token whose weight π_prox/π_behav exceeds this is dropped (AReaL: 5)'),
    aggregation: z.enum(AGGREGATIONS).default('token_mean'),
    ...klParams,
  }),
  ports: (p) => withRef(['behav', 'prox', 'advantages'], p),
  stats: ['clipfrac', 'weight_mean', 'capped'],
  compute({ pred, data, mask, norm, params: p }) {
    const clipHigh = p.clip_high ?? p.clip;
    const raw = tf.exp(tf.sub(data.prox!, data.behav!)); // data, so no gradient
    const kept = tf.lessEqual(raw, p.cap);
    const weight = tf.where(kept, raw, tf.zerosLike(raw));
    let perToken = tf.mul(weight, clippedSurrogate(pred, data.prox!, data.advantages!, p.clip, clipHigh));
    if (p.kl_coef > 0) perToken = tf.add(perToken, tf.mul(p.kl_coef, klTensor(pred, data.ref!, p.kl)));
    return {
      loss: aggregate(perToken, p.aggregation, mask, norm),
      stats: {
        clipfrac: tokenShare(outsideClip(tf.exp(tf.sub(pred, data.prox!)), p.clip, clipHigh), mask, norm),
        weight_mean: tokenMean(weight, mask, norm),
        capped: tokenShare(tf.logicalNot(kept), mask, norm),
      },
    };
  },
});
