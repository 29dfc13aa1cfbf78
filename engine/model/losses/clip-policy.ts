// The clipped policy loss (Schulman et al. 2017) and its variants: separate ε_low/ε_high (DAPO's
// clip-higher), a KL term in the loss (`kl_coef` > 0 reads `ref`), and the aggregation.
// With neither, it is the classic clipped surrogate over the batch's tokens.
import * as tf from '@tensorflow/tfjs';
import { z } from 'zod';
import { defineLoss } from './define.ts';
import { AGGREGATIONS, KL_ESTIMATORS, aggregate, clippedSurrogate, klTensor, outsideClip, tokenShare } from './reduce.ts';

/** The KL-in-the-loss parameters that the policy losses share. */
export const klParams = {
  kl_coef: z.number().min(0).default(0).describe('β of a KL(π‖π_ref) term in the loss (0: none; > 0 reads the ref port)'),
  kl: z.enum(KL_ESTIMATORS).default('k3').describe("the KL estimator (Schulman's k1, k2, k3)"),
};

/** The ports of a policy loss: its own, and `ref` when it has a KL term. */
export const withRef = (ports: string[], p: { kl_coef: number }) => (p.kl_coef > 0 ? [...ports, 'ref'] : ports);

export const clipPolicy = defineLoss({
  name: 'clip_policy',
  summary: 'the clipped surrogate −min(r·A, clip(r, 1−ε, 1+ε_high)·A), r per token; optional KL term and aggregation',
  head: 'policy',
  params: z.strictObject({
    clip: z.number().positive().default(0.2).describe('ε (ε_low with clip_high)'),
    clip_high: z.number().positive().optional().describe('ε_high of clip-higher (DAPO: 0.28); defaults to clip'),
    aggregation: z.enum(AGGREGATIONS).default('token_mean'),
    ...klParams,
  }),
  ports: (p) => withRef(['old', 'advantages'], p),
  stats: ['clipfrac'],
  compute({ pred, data, mask, norm, params: p }) {
    const clipHigh = p.clip_high ?? p.clip;
    let perToken = clippedSurrogate(pred, data.old!, data.advantages!, p.clip, clipHigh);
    if (p.kl_coef > 0) perToken = tf.add(perToken, tf.mul(p.kl_coef, klTensor(pred, data.ref!, p.kl)));
    return {
      loss: aggregate(perToken, p.aggregation, mask, norm),
      stats: { clipfrac: tokenShare(outsideClip(tf.exp(tf.sub(pred, data.old!)), p.clip, clipHigh), mask, norm) },
    };
  },
});
