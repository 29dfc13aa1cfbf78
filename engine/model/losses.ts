// The losses a train call can ask for, by name, in TensorFlow.js over [rows, responseLen] tensors.
// A train call names one (`loss: { name, params }`) and sends the per-token arrays it reads; the
// shard computes its head's prediction (log-probs or values) and hands it here. The registry knows
// nothing of algorithms: an algorithm picks a loss and fills its ports.
import * as tf from '@tensorflow/tfjs';

export class LossError extends Error {
  override name = 'LossError';
}

export type LossParams = Record<string, number | string | boolean>;

/**
 * What a mini-batch's loss divides by: its real (unmasked) response tokens and its rows, over the
 * whole mini-batch. A replica that holds part of the mini-batch divides its sums by these, so the
 * replicas' parts add up to the mini-batch's loss.
 */
export interface LossNorm {
  tokens: number;
  rows: number;
}

export interface LossFn {
  /** The head whose prediction the loss reads: log-probs of the response (policy) or values. */
  head: 'policy' | 'value';
  /** The per-token arrays ([rows, responseLen]) it reads besides the tokens (and the response mask, which every loss reads). */
  ports(params: LossParams): string[];
  /**
   * Rows per item: 2 for a loss over pairs, whose call's rows are every chosen row, then every
   * rejected row (item i is rows i and items + i); mini-batches and replicas split items.
   */
  rowsPerItem: 1 | 2;
  /**
   * The loss of a mini-batch, counting only the tokens `data.mask` keeps (all, without a mask).
   * `pred`: [rows, R] in the call's row order (chosen half first for pairs). `norm`: the whole
   * mini-batch's totals when `pred` is a replica's part of it (default: `pred`'s own).
   */
  loss(pred: tf.Tensor, data: Record<string, tf.Tensor>, params: LossParams, norm?: LossNorm): tf.Scalar;
  /** How many of the mini-batch's real tokens (or items) were clipped; 0 where nothing clips. */
  clipped(pred: tf.Tensor, data: Record<string, tf.Tensor>, params: LossParams): number;
}

/** The response mask a loss reads: `data.mask`, or every token when there is none. */
function maskOf(pred: tf.Tensor, data: Record<string, tf.Tensor>): tf.Tensor {
  return data.mask ?? tf.onesLike(pred);
}

/** The whole mini-batch's totals, defaulting to this part's own. */
function normOf(mask: tf.Tensor, norm: LossNorm | undefined): LossNorm {
  return norm ?? { tokens: tf.sum(mask).arraySync() as number, rows: mask.shape[0]! };
}

/** Σ over real tokens, then divided: the masked token mean of a mini-batch (0 when it has no real token). */
function tokenMean(perToken: tf.Tensor, mask: tf.Tensor, norm: LossNorm): tf.Scalar {
  return tf.div(tf.sum(tf.mul(perToken, mask)), Math.max(norm.tokens, 1)) as tf.Scalar;
}

const num = (params: LossParams, key: string, fallback?: number): number => {
  const v = params[key] ?? fallback;
  if (typeof v !== 'number' || !Number.isFinite(v)) throw new LossError(`loss parameter '${key}': expected a finite number, got ${JSON.stringify(v)}`);
  return v;
};
const str = <T extends string>(params: LossParams, key: string, allowed: readonly T[], fallback: T): T => {
  const v = params[key] ?? fallback;
  if (!allowed.includes(v as T)) throw new LossError(`loss parameter '${key}': expected one of ${allowed.join(', ')}, got ${JSON.stringify(v)}`);
  return v as T;
};

/**
 * Clipped surrogate: the mean over the tokens `mask` keeps (all, without one) of
 * −min(r·A, clip(r, 1−ε, 1+ε)·A), r = exp(logp − old); `norm` as for LossFn.loss.
 */
export function policyLoss(logprobs: tf.Tensor, old: tf.Tensor, advantages: tf.Tensor, clip: number, clipHigh = clip, mask?: tf.Tensor, norm?: LossNorm): tf.Scalar {
  return tf.tidy(() => {
    const m = mask ?? tf.onesLike(logprobs);
    return tokenMean(tf.neg(surrogate(logprobs, old, advantages, clip, clipHigh)), m, normOf(m, norm));
  });
}

function surrogate(logprobs: tf.Tensor, old: tf.Tensor, advantages: tf.Tensor, clip: number, clipHigh: number): tf.Tensor {
  const ratio = tf.exp(tf.sub(logprobs, old));
  const unclipped = tf.mul(ratio, advantages);
  const clipped = tf.mul(tf.clipByValue(ratio, 1 - clip, 1 + clipHigh), advantages);
  return tf.minimum(unclipped, clipped);
}

/**
 * Clipped value loss: ½ × the mean over the tokens `mask` keeps (all, without one) of
 * max((V − R)², (V_old + clip(V − V_old, ±ε) − R)²); `norm` as for LossFn.loss.
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
  return tf.div(tf.sum(per), Math.max(norm.rows, 1)) as tf.Scalar;
}

/**
 * The clipped policy loss with its variants: separate ε_low/ε_high (`clip`, `clip_high`), a KL
 * term in the loss (`kl_coef` > 0 reads `ref`; `kl` picks the estimator) and the aggregation.
 * With neither, it is the classic clipped surrogate (the masked token mean of policyLoss).
 */
const clipPolicy: LossFn = {
  head: 'policy',
  rowsPerItem: 1,
  ports: (p) => ['old', 'advantages', ...(num(p, 'kl_coef', 0) > 0 ? ['ref'] : [])],
  loss(pred, data, p, norm) {
    const clip = num(p, 'clip');
    const clipHigh = num(p, 'clip_high', clip);
    const kl = num(p, 'kl_coef', 0);
    const how = str(p, 'aggregation', AGGREGATIONS, 'token_mean');
    return tf.tidy(() => {
      const mask = maskOf(pred, data);
      let perToken = tf.neg(surrogate(pred, data.old!, data.advantages!, clip, clipHigh));
      if (kl > 0) perToken = tf.add(perToken, tf.mul(kl, klTensor(pred, data.ref!, str(p, 'kl', KL_ESTIMATORS, 'k3'))));
      return aggregate(perToken, how, mask, normOf(mask, norm));
    });
  },
  clipped(pred, data, p) {
    const clip = num(p, 'clip');
    const clipHigh = num(p, 'clip_high', clip);
    return tf.tidy(() => {
      const ratio = tf.exp(tf.sub(pred, data.old!));
      // Symmetric clipping counts as it always has (|r − 1| > ε); clip-higher counts each side against its own bound.
      const out = clipHigh === clip ? tf.greater(tf.abs(tf.sub(ratio, 1)), clip) : tf.logicalOr(tf.greater(ratio, 1 + clipHigh), tf.less(ratio, 1 - clip));
      return tf.sum(tf.mul(tf.cast(out, 'float32'), maskOf(pred, data))).arraySync() as number;
    });
  },
};

const clipValue: LossFn = {
  head: 'value',
  rowsPerItem: 1,
  ports: () => ['old', 'returns'],
  loss: (pred, data, p, norm) => valueLoss(pred, data.old!, data.returns!, num(p, 'clip'), data.mask, norm),
  clipped(pred, data, p) {
    return tf.tidy(() => tf.sum(tf.mul(tf.cast(tf.greater(tf.abs(tf.sub(pred, data.old!)), num(p, 'clip')), 'float32'), maskOf(pred, data))).arraySync() as number);
  },
};

/**
 * The logistic loss of pairs: with h(y) = Σ_t (log π − log π_ref), loss = mean −log σ(β·(h(y_w) − h(y_l))).
 * The rows are the chosen responses, then the rejected ones, item for item.
 */
const pairSigmoid: LossFn = {
  head: 'policy',
  rowsPerItem: 2,
  ports: () => ['ref'],
  loss(pred, data, p, norm) {
    const beta = num(p, 'beta');
    return tf.tidy(() => {
      const mask = maskOf(pred, data);
      const h = tf.sum(tf.mul(tf.sub(pred, data.ref!), mask), 1); // [2n], each response's own tokens
      const n = h.shape[0]! / 2;
      const margin = tf.sub(tf.slice(h, [0], [n]), tf.slice(h, [n], [n]));
      return tf.div(tf.sum(tf.softplus(tf.neg(tf.mul(beta, margin)))), Math.max(normOf(mask, norm).rows / 2, 1)) as tf.Scalar;
    });
  },
  clipped: () => 0,
};

/** Losses by name. A variant is one more entry. */
export const LOSSES: Record<string, LossFn> = {
  clip_policy: clipPolicy,
  clip_value: clipValue,
  pair_sigmoid: pairSigmoid,
};

export function lossOf(name: string): LossFn {
  const fn = LOSSES[name];
  if (!fn) throw new LossError(`unknown loss '${name}'; known: ${Object.keys(LOSSES).join(', ')}`);
  return fn;
}

/** The rows of items `items` (see LossFn.rowsPerItem): for pairs, their chosen rows then their rejected rows. */
export function itemRows(items: readonly number[], totalItems: number, rowsPerItem: 1 | 2): number[] {
  return rowsPerItem === 1 ? [...items] : [...items, ...items.map((i) => totalItems + i)];
}
