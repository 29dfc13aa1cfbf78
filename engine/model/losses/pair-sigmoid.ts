// The logistic loss of preference pairs (Rafailov et al. 2023): with h(y) = Σ_t (log π − log π_ref),
// loss = mean −log σ(β·(h(y_w) − h(y_l))). The rows are the chosen responses, then the rejected
// ones, item for item.
import * as tf from '@tensorflow/tfjs';
import { z } from 'zod';
import { defineLoss } from './define.ts';

export const pairSigmoid = defineLoss({
  name: 'pair_sigmoid',
  summary: '−log σ(β·(h(y_w) − h(y_l))), h = Σ_t (log π − log π_ref), over pairs',
  head: 'policy',
  rowsPerItem: 2,
  params: z.strictObject({ beta: z.number().positive().describe('β: how far from the reference the policy may move (the algorithm sets it)') }),
  ports: ['ref'],
  compute({ pred, data, mask, norm, params: p }) {
    const h = tf.sum(tf.mul(tf.sub(pred, data.ref!), mask), 1); // [2n], each response's own tokens
    const n = h.shape[0]! / 2;
    const margin = tf.sub(tf.slice(h, [0], [n]), tf.slice(h, [n], [n]));
    return { loss: tf.div(tf.sum(tf.softplus(tf.neg(tf.mul(p.beta, margin)))), Math.max(norm.rows / 2, 1)) as tf.Scalar };
  },
});
