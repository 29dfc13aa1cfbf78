// Advantage arithmetic: plain JavaScript in float64 over row-major `[rows, responseLen]` arrays,
// summed in index order so every process gets the same bits. The estimators are a registry
// (ESTIMATORS): an algorithm's advantage step names one, and a variant is one more function. The
// losses, which are differentiated, are TensorFlow.js (engine/model/losses/).
import type { KlEstimator } from '../model/index.ts';

/**
 * Each row's span: up to and with its last token the mask keeps (a response's length, when its
 * ones are a prefix; an episode's last action, when observations sit between its actions), or
 * the whole budget without a mask.
 */
export function rowLengths(rows: number, responseLen: number, mask?: ArrayLike<number>): Int32Array {
  if (!mask) return new Int32Array(rows).fill(responseLen);
  const out = new Int32Array(rows);
  for (let b = 0; b < rows; b++) {
    let last = -1;
    for (let t = 0; t < responseLen; t++) if (mask[b * responseLen + t]! > 0) last = t;
    out[b] = last + 1;
  }
  return out;
}

/** `advantages` with 0 wherever the mask is 0 (an episode's observations, in its span), in place. */
function onMasked(advantages: Float32Array, mask: ArrayLike<number> | undefined): Float32Array {
  if (mask) for (let i = 0; i < advantages.length; i++) if (!(mask[i]! > 0)) advantages[i] = 0;
  return advantages;
}

/**
 * Per-token rewards: −β·(log π − log π_ref) at every token a response has, plus the sequence's
 * score on its last token (the usual RLHF shaping); 0 after the end. Returns the rewards and the
 * KL estimate per sequence: the log-ratio summed over a response's tokens, averaged over the batch.
 */
export function tokenRewards(
  scores: ArrayLike<number>,
  logprobs: ArrayLike<number>,
  refLogprobs: ArrayLike<number>,
  responseLen: number,
  klCoef: number,
  lengths: ArrayLike<number> = rowLengths(scores.length, responseLen),
  /**
   * An episode's step rewards [rows, responseLen], each at the last token of its action: they stay
   * where they are, and the last token gets the rest of the row's score (the rule's, reward
   * actors'). 0 everywhere (or absent): the score sits on the last token alone.
   */
  stepRewards?: ArrayLike<number>,
): { rewards: Float64Array; kl: number } {
  const rewards = new Float64Array(logprobs.length);
  let klSum = 0;
  for (let b = 0; b < scores.length; b++) {
    const L = lengths[b]!;
    let stepped = 0;
    for (let t = 0; t < L; t++) {
      const i = b * responseLen + t;
      const kl = logprobs[i]! - refLogprobs[i]!;
      klSum += kl;
      rewards[i] = -klCoef * kl;
      const step = stepRewards?.[i] ?? 0;
      if (step !== 0) {
        rewards[i]! += step;
        stepped += step;
      }
    }
    if (L > 0) rewards[b * responseLen + L - 1]! += stepped === 0 ? scores[b]! : scores[b]! - stepped;
  }
  return { rewards, kl: scores.length > 0 ? klSum / scores.length : 0 };
}

/**
 * Generalised advantage estimation per sequence, backwards in time from its last token, with V
 * after it taken as 0 (the episode ends there). Returns advantages and returns (= advantages +
 * values), 0 after each sequence's end.
 */
export function gae(
  rewards: ArrayLike<number>,
  values: ArrayLike<number>,
  responseLen: number,
  gamma: number,
  lambda: number,
  lengths: ArrayLike<number> = rowLengths(rewards.length / responseLen, responseLen),
): { advantages: Float64Array; returns: Float64Array } {
  const n = rewards.length;
  const advantages = new Float64Array(n);
  const returns = new Float64Array(n);
  for (let row = 0; row < n / responseLen; row++) {
    let next = 0;
    let nextValue = 0;
    for (let t = lengths[row]! - 1; t >= 0; t--) {
      const i = row * responseLen + t;
      const delta = rewards[i]! + gamma * nextValue - values[i]!;
      next = delta + gamma * lambda * next;
      advantages[i] = next;
      returns[i] = next + values[i]!;
      nextValue = values[i]!;
    }
  }
  return { advantages, returns };
}

/**
 * (x − mean) / (std + eps), with the population std, over the entries `mask` keeps (all, without
 * one); the others come out 0. Sums in index order.
 */
export function whiten(x: ArrayLike<number>, eps = 1e-8, mask?: ArrayLike<number>): Float64Array {
  const keep = (i: number) => !mask || mask[i]! > 0;
  let n = 0;
  let sum = 0;
  for (let i = 0; i < x.length; i++) {
    if (!keep(i)) continue;
    sum += x[i]!;
    n += 1;
  }
  const out = new Float64Array(x.length);
  if (n === 0) return out;
  const mean = sum / n;
  let sq = 0;
  for (let i = 0; i < x.length; i++) if (keep(i)) sq += (x[i]! - mean) ** 2;
  const std = Math.sqrt(sq / n);
  for (let i = 0; i < x.length; i++) if (keep(i)) out[i] = (x[i]! - mean) / (std + eps);
  return out;
}

export function mean(x: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < x.length; i++) s += x[i]!;
  return x.length ? s / x.length : 0;
}

/** Schulman's estimators of KL(π‖π_ref) at one token, from d = log π − log π_ref. */
export function klOf(d: number, estimator: KlEstimator): number {
  if (estimator === 'k1') return d;
  if (estimator === 'k2') return (d * d) / 2;
  return Math.exp(-d) - 1 + d;
}

/** Each row's KL summed over the tokens it has, by the estimator. */
export function sequenceKl(
  logprobs: ArrayLike<number>,
  ref: ArrayLike<number>,
  responseLen: number,
  estimator: KlEstimator = 'k1',
  lengths: ArrayLike<number> = rowLengths(logprobs.length / responseLen, responseLen),
): Float64Array {
  const rows = logprobs.length / responseLen;
  const out = new Float64Array(rows);
  for (let b = 0; b < rows; b++) {
    let s = 0;
    for (let t = 0; t < lengths[b]!; t++) s += klOf(logprobs[b * responseLen + t]! - ref[b * responseLen + t]!, estimator);
    out[b] = s;
  }
  return out;
}

/** Every token a row has gets that row's value (0 after its end): an outcome advantage, [rows, responseLen]. */
export function perToken(perRow: ArrayLike<number>, responseLen: number, lengths: ArrayLike<number> = rowLengths(perRow.length, responseLen)): Float32Array {
  const out = new Float32Array(perRow.length * responseLen);
  for (let b = 0; b < perRow.length; b++) out.fill(perRow[b]!, b * responseLen, b * responseLen + lengths[b]!);
  return out;
}

/**
 * GRPO: within each group of G rows (the samples of one prompt), (r − mean) / (std + ε), with the
 * sample standard deviation (N − 1, as verl's torch.std); `scale: false` leaves out the division
 * (Dr. GRPO). A group of one sample, or whose rewards are all equal, gets 0.
 */
export function groupNormalised(scores: ArrayLike<number>, group: number, scale = true, eps = 1e-6): { advantages: Float64Array; flatGroups: number } {
  const n = scores.length;
  const out = new Float64Array(n);
  let flat = 0;
  for (let g0 = 0; g0 < n; g0 += group) {
    let sum = 0;
    for (let i = g0; i < g0 + group; i++) sum += scores[i]!;
    const m = sum / group;
    let sq = 0;
    for (let i = g0; i < g0 + group; i++) sq += (scores[i]! - m) ** 2;
    const std = group > 1 ? Math.sqrt(sq / (group - 1)) : 0;
    if (std === 0) flat += 1;
    for (let i = g0; i < g0 + group; i++) out[i] = group > 1 ? (scale ? (scores[i]! - m) / (std + eps) : scores[i]! - m) : 0;
  }
  return { advantages: out, flatGroups: flat / (n / group) };
}

/** RLOO: each row's reward less the mean of the other G − 1 rows of its group. */
export function leaveOneOut(scores: ArrayLike<number>, group: number): Float64Array {
  if (group < 2) throw new RangeError(`leave-one-out needs at least 2 samples per prompt, got ${group}`);
  const out = new Float64Array(scores.length);
  for (let g0 = 0; g0 < scores.length; g0 += group) {
    let sum = 0;
    for (let i = g0; i < g0 + group; i++) sum += scores[i]!;
    for (let i = g0; i < g0 + group; i++) out[i] = scores[i]! - (sum - scores[i]!) / (group - 1);
  }
  return out;
}

/** REINFORCE with γ: each token's return, the sum of its own and later rewards (discounted) up to its row's end. */
export function discountedReturns(rewards: ArrayLike<number>, responseLen: number, gamma = 1, lengths: ArrayLike<number> = rowLengths(rewards.length / responseLen, responseLen)): Float64Array {
  const out = new Float64Array(rewards.length);
  for (let row = 0; row < rewards.length / responseLen; row++) {
    let acc = 0;
    for (let t = lengths[row]! - 1; t >= 0; t--) {
      const i = row * responseLen + t;
      acc = rewards[i]! + gamma * acc;
      out[i] = acc;
    }
  }
  return out;
}

/** What an advantage estimator reads: the batch's fields, and the shape of the batch. */
export interface AdvantageInput {
  /** Each row's reward. */
  scores: ArrayLike<number>;
  logprobs: ArrayLike<number>;
  /** The reference's log-probs; with a KL coefficient, the penalty reads them. */
  ref?: ArrayLike<number>;
  values?: ArrayLike<number>;
  /** Each row's baseline reward (ReMax: the greedy response's). */
  baseline?: ArrayLike<number>;
  responseLen: number;
  group: number;
  /**
   * The response mask [rows, responseLen]: 1 at the tokens a response has, then 0 (a prefix of
   * each row). Absent: every response has all `responseLen` tokens.
   */
  mask?: ArrayLike<number>;
  /** An episode's step rewards by token (weighted, within `scores`): the token-level estimators place them (tokenRewards). */
  stepRewards?: ArrayLike<number>;
}

export interface AdvantageOptions {
  /** β of the KL penalty in the reward (0: none). */
  kl_coef: number;
  kl_estimator?: KlEstimator;
  gamma?: number;
  lambda?: number;
  /** GRPO: divide by the group's standard deviation. */
  scale?: boolean;
}

export interface AdvantageOutput {
  /** Per token, [rows, responseLen]; 0 after each response's end. */
  advantages: Float32Array;
  /** A value model's targets, where the estimator has them. */
  returns?: Float32Array;
  /** Statistics for the metrics: `kl` (a row's KL summed over its tokens, averaged), and the estimator's own. */
  stats: Record<string, number>;
}

const need = <T>(x: T | undefined, what: string, estimator: string): T => {
  if (x === undefined) throw new RangeError(`the '${estimator}' advantage needs ${what}`);
  return x;
};

/** Rewards less β times each row's KL (summed over its tokens by the estimator): a sequence-level penalty. */
function penalised(inp: AdvantageInput, o: AdvantageOptions, lengths: Int32Array): { rewards: Float64Array; kl: number } {
  const kl = inp.ref ? sequenceKl(inp.logprobs, inp.ref, inp.responseLen, o.kl_estimator ?? 'k1', lengths) : new Float64Array(inp.scores.length);
  const rewards = Float64Array.from(inp.scores, (r, b) => r - o.kl_coef * kl[b]!);
  return { rewards, kl: inp.ref ? mean(sequenceKl(inp.logprobs, inp.ref, inp.responseLen, 'k1', lengths)) : 0 };
}

const lengthsOf = (inp: AdvantageInput) => rowLengths(inp.scores.length, inp.responseLen, inp.mask);

/** Advantage estimators by name; an algorithm's advantage step names one. Each counts only the tokens a response has. */
export const ESTIMATORS: Record<string, (inp: AdvantageInput, o: AdvantageOptions) => AdvantageOutput> = {
  /** PPO: KL-shaped token rewards, GAE over the values (stopping at each end), whitened over the batch's real tokens. */
  gae(inp, o) {
    const lengths = lengthsOf(inp);
    const { rewards, kl } = tokenRewards(inp.scores, inp.logprobs, need(inp.ref, 'reference log-probs', 'gae'), inp.responseLen, o.kl_coef, lengths, inp.stepRewards);
    const { advantages, returns } = gae(rewards, need(inp.values, 'values', 'gae'), inp.responseLen, o.gamma ?? 1, o.lambda ?? 0.95, lengths);
    return { advantages: Float32Array.from(whiten(advantages, 1e-8, inp.mask)), returns: Float32Array.from(returns), stats: { kl } };
  },
  /** GRPO: the reward (less a KL penalty, when β > 0) normalised within each prompt's group. */
  grpo(inp, o) {
    const lengths = lengthsOf(inp);
    const { rewards, kl } = penalised(inp, o, lengths);
    const { advantages, flatGroups } = groupNormalised(rewards, inp.group, o.scale ?? true);
    return { advantages: onMasked(perToken(advantages, inp.responseLen, lengths), inp.mask), stats: { kl, flat_groups: flatGroups } };
  },
  /** RLOO: the reward less the mean of the group's other samples. */
  rloo(inp, o) {
    const lengths = lengthsOf(inp);
    const { rewards, kl } = penalised(inp, o, lengths);
    return { advantages: onMasked(perToken(leaveOneOut(rewards, inp.group), inp.responseLen, lengths), inp.mask), stats: { kl } };
  },
  /** ReMax: the reward less the greedy response's reward. */
  remax(inp, o) {
    const lengths = lengthsOf(inp);
    const { rewards, kl } = penalised(inp, o, lengths);
    const base = need(inp.baseline, 'baseline rewards', 'remax');
    return {
      advantages: onMasked(
        perToken(
          Float64Array.from(rewards, (r, b) => r - base[b]!),
          inp.responseLen,
          lengths,
        ),
        inp.mask,
      ),
      stats: { kl, baseline_reward: mean(base) },
    };
  },
  /** REINFORCE++: KL-shaped token rewards, returns as suffix sums to each end, z-scored over the batch's real tokens. */
  reinforce_pp(inp, o) {
    const lengths = lengthsOf(inp);
    const { rewards, kl } = tokenRewards(inp.scores, inp.logprobs, need(inp.ref, 'reference log-probs', 'reinforce_pp'), inp.responseLen, o.kl_coef, lengths, inp.stepRewards);
    return { advantages: Float32Array.from(whiten(discountedReturns(rewards, inp.responseLen, o.gamma ?? 1, lengths), 1e-8, inp.mask)), stats: { kl } };
  },
};

export function estimator(name: string): (inp: AdvantageInput, o: AdvantageOptions) => AdvantageOutput {
  const fn = ESTIMATORS[name];
  if (!fn) throw new RangeError(`unknown advantage estimator '${name}'; known: ${Object.keys(ESTIMATORS).join(', ')}`);
  return fn;
}
