// GSPO (Zheng et al. 2025, Qwen): the importance ratio of a whole sequence, length-normalised,
// s_i = exp((1/|o_i|)·Σ_t (log π_θ − log π_old)), clipped at the sequence level with a small ε:
// loss = −(1/G)·Σ_i min(s_i·A_i, clip(s_i, 1−ε, 1+ε_high)·A_i). The gradient reaches every token
// of s_i. A_i is the response's advantage (the mean of its tokens' advantages: the group-relative A_i).
import * as tf from '@tensorflow/tfjs';
import { z } from 'zod';
import { klParams, withRef } from './clip-policy.ts';
import { defineLoss } from './define.ts';
import { aggregate, klTensor, outsideClip, rowMean, seqMean } from './reduce.ts';

export const gspo = defineLoss({
  name: 'gspo',
  summary: 'sequence-level ratio s = exp(mean_t(log π − log π_old)), clipped per sequence with small ε (3e-4 / 4e-4)',
  head: 'policy',
  params: z.strictObject({
    clip: z.number().positive().default(3e-4).describe('ε_low of the sequence ratio (the paper: 3e-4)'),
    clip_high: z.number().positive().default(4e-4).describe('ε_high of the sequence ratio (the paper: 4e-4)'),
    ...klParams,
  }),
  ports: (p) => withRef(['old', 'advantages'], p),
  stats: ['clipfrac', 'ratio_mean'],
  compute({ pred, data, mask, norm, params: p }) {
    const s = tf.exp(rowMean(tf.sub(pred, data.old!), mask)); // [rows]
    const A = rowMean(data.advantages!, mask); // [rows]
    const objective = tf.minimum(tf.mul(s, A), tf.mul(tf.clipByValue(s, 1 - p.clip, 1 + p.clip_high), A));
    let loss = seqMean(tf.neg(objective), norm);
    // The KL term, when it is in the loss, counts per sequence too (each response's token mean).
    if (p.kl_coef > 0) loss = tf.add(loss, tf.mul(p.kl_coef, aggregate(klTensor(pred, data.ref!, p.kl), 'seq_mean_token_mean', mask, norm)));
    return {
      loss,
      // The share of sequences whose ratio was clipped, and their mean ratio.
      stats: { clipfrac: seqMean(tf.cast(outsideClip(s, p.clip, p.clip_high), 'float32'), norm), ratio_mean: seqMean(s, norm) },
    };
  },
});
