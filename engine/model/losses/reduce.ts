// The pieces losses are made of: masked means and sums that divide by the whole mini-batch's
// totals (so that data-parallel replicas' parts add up), the clipped surrogate, KL estimators.
// Every tensor is [rows, R] unless said otherwise.
import * as tf from '@tensorflow/tfjs';
import type { LossNorm } from './define.ts';

/** The whole mini-batch's totals, defaulting to this part's own. */
export function normOf(mask: tf.Tensor, norm: LossNorm | undefined): LossNorm {
  return norm ?? { tokens: tf.sum(mask).arraySync() as number, rows: mask.shape[0]! };
}

/** Σ over real tokens, then divided: the masked token mean of a mini-batch (0 when it has no real token). */
export function tokenMean(perToken: tf.Tensor, mask: tf.Tensor, norm: LossNorm): tf.Scalar {
  return tf.div(tf.sum(tf.mul(perToken, mask)), Math.max(norm.tokens, 1)) as tf.Scalar;
}

/** Each row's mean over its own real tokens, [rows] (0 for a row with none). */
export function rowMean(perToken: tf.Tensor, mask: tf.Tensor): tf.Tensor1D {
  return tf.div(tf.sum(tf.mul(perToken, mask), 1), tf.maximum(tf.sum(mask, 1), 1)) as tf.Tensor1D;
}

/** Σ of a per-row value, divided by the mini-batch's rows: the sequence mean, replica parts adding up. */
export function seqMean(perRow: tf.Tensor, norm: LossNorm): tf.Scalar {
  return tf.div(tf.sum(perRow), Math.max(norm.rows, 1)) as tf.Scalar;
}

/** The share of real tokens where `where` holds, as a statistic (replica parts add up). */
export function tokenShare(where: tf.Tensor, mask: tf.Tensor, norm: LossNorm): tf.Scalar {
  return tokenMean(tf.cast(where, 'float32'), mask, norm);
}

/** −min(r·A, clip(r, 1−ε, 1+ε_high)·A) with r = exp(logp − old): the clipped surrogate, negated. */
export function clippedSurrogate(logprobs: tf.Tensor, old: tf.Tensor, advantages: tf.Tensor, clip: number, clipHigh: number): tf.Tensor {
  const ratio = tf.exp(tf.sub(logprobs, old));
  const unclipped = tf.mul(ratio, advantages);
  const clipped = tf.mul(tf.clipByValue(ratio, 1 - clip, 1 + clipHigh), advantages);
  return tf.neg(tf.minimum(unclipped, clipped));
}

/** Where a ratio lies outside its clip range: |r − 1| > ε when symmetric, each side against its own bound otherwise. */
export function outsideClip(ratio: tf.Tensor, clip: number, clipHigh: number): tf.Tensor {
  return clipHigh === clip ? tf.greater(tf.abs(tf.sub(ratio, 1)), clip) : tf.logicalOr(tf.greater(ratio, 1 + clipHigh), tf.less(ratio, 1 - clip));
}

/**
 * Clipped surrogate: the mean over the tokens `mask` keeps (all, without one) of
 * −min(r·A, clip(r, 1−ε, 1+ε)·A), r = exp(logp − old); `norm` as in LossInput.
 */
export function policyLoss(logprobs: tf.Tensor, old: tf.Tensor, advantages: tf.Tensor, clip: number, clipHigh = clip, mask?: tf.Tensor, norm?: LossNorm): tf.Scalar {
  return tf.tidy(() => {
    const m = mask ?? tf.onesLike(logprobs);
    return tokenMean(clippedSurrogate(logprobs, old, advantages, clip, clipHigh), m, normOf(m, norm));
  });
}

/**
 * Clipped value loss: ½ × the mean over the tokens `mask` keeps (all, without one) of
 * max((V − R)², (V_old + clip(V − V_old, ±ε) − R)²); `norm` as in LossInput.
 */
export function valueLoss(values: tf.Tensor, old: tf.Tensor, returns: tf.Tensor, clip: number, mask?: tf.Tensor, norm?: LossNorm): tf.Scalar {
  return tf.tidy(() => {
    const m = mask ?? tf.onesLike(values);
    const clippedValues = tf.add(old, tf.clipByValue(tf.sub(values, old), -clip, clip));
    const worst = tf.maximum(tf.square(tf.sub(values, returns)), tf.square(tf.sub(clippedValues, returns)));
    return tf.mul(0.5, tokenMean(worst, m, normOf(m, norm))) as tf.Scalar;
  });
}

/** Bradley–Terry: mean of −log σ(r_chosen − r_rejected) = softplus(r_rejected − r_chosen). */
export function preferenceLoss(chosen: tf.Tensor, rejected: tf.Tensor): tf.Scalar {
  return tf.tidy(() => tf.mean(tf.softplus(tf.sub(rejected, chosen))) as tf.Scalar);
}

export const KL_ESTIMATORS = ['k1', 'k2', 'k3'] as const;
export type KlEstimator = (typeof KL_ESTIMATORS)[number];

/** Schulman's per-token estimators of KL(π‖π_ref) from d = log π − log π_ref. */
export function klTensor(logprobs: tf.Tensor, ref: tf.Tensor, estimator: KlEstimator): tf.Tensor {
  const d = tf.sub(logprobs, ref);
  if (estimator === 'k1') return d;
  if (estimator === 'k2') return tf.mul(0.5, tf.square(d));
  return tf.add(tf.sub(tf.exp(tf.neg(d)), 1), d);
}

/**
 * How a per-token loss becomes one number (the choice matters once responses are ragged):
 * `token_mean` over every token of the mini-batch; `seq_mean_token_mean` per sequence, then over
 * sequences (1/|o_i| per sequence); `seq_mean_token_sum_norm` each sequence's sum divided by the
 * response budget (a constant), then over sequences. While every response has the same
 * length the three agree; they part once responses are ragged and masked (padding counts in none).
 */
export const AGGREGATIONS = ['token_mean', 'seq_mean_token_mean', 'seq_mean_token_sum_norm'] as const;
export type Aggregation = (typeof AGGREGATIONS)[number];

/**
 * A per-token loss [rows, R] as one number, counting the tokens `mask` keeps; `norm` holds the
 * whole mini-batch's totals. token_mean: Σ/tokens; seq_mean_token_mean: each row's Σ over its own
 * length, summed over rows / rows; seq_mean_token_sum_norm: each row's Σ / R, summed / rows.
 */
export function aggregate(perToken: tf.Tensor, how: Aggregation, mask: tf.Tensor = tf.onesLike(perToken), norm: LossNorm = normOf(mask, undefined)): tf.Scalar {
  if (how === 'token_mean') return tokenMean(perToken, mask, norm);
  const R = perToken.shape[1]!;
  const sums = tf.sum(tf.mul(perToken, mask), 1);
  const per = how === 'seq_mean_token_mean' ? tf.div(sums, tf.maximum(tf.sum(mask, 1), 1)) : tf.div(sums, R);
  return seqMean(per, norm);
}

/** The rows of items `items` (see LossDefinition.rowsPerItem): for pairs, their chosen rows then their rejected rows. */
export function itemRows(items: readonly number[], totalItems: number, rowsPerItem: 1 | 2): number[] {
  return rowsPerItem === 1 ? [...items] : [...items, ...items.map((i) => totalItems + i)];
}
