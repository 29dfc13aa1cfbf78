// PPO's advantage arithmetic: plain JavaScript in float64 over row-major `[batch, responseLen]`
// arrays, summed in index order so every process gets the same bits. The losses, which are
// differentiated, are TensorFlow.js (losses.ts).

/**
 * Per-token rewards: −β·(log π − log π_ref) at every token, plus the sequence's score on its last
 * token (the usual RLHF shaping). Returns the rewards and the KL estimate per sequence: the
 * log-ratio summed over a response's tokens, averaged over the batch.
 */
export function tokenRewards(
  scores: ArrayLike<number>,
  logprobs: ArrayLike<number>,
  refLogprobs: ArrayLike<number>,
  responseLen: number,
  klCoef: number,
): { rewards: Float64Array; kl: number } {
  const n = logprobs.length;
  const rewards = new Float64Array(n);
  let klSum = 0;
  for (let i = 0; i < n; i++) {
    const kl = logprobs[i]! - refLogprobs[i]!;
    klSum += kl;
    rewards[i] = -klCoef * kl;
  }
  for (let b = 0; b < scores.length; b++) rewards[b * responseLen + responseLen - 1]! += scores[b]!;
  return { rewards, kl: n > 0 ? (klSum / n) * responseLen : 0 };
}

/**
 * Generalised advantage estimation per sequence, backwards in time, with V after the last token
 * taken as 0 (the episode ends there). Returns advantages and returns (= advantages + values).
 */
export function gae(
  rewards: ArrayLike<number>,
  values: ArrayLike<number>,
  responseLen: number,
  gamma: number,
  lambda: number,
): { advantages: Float64Array; returns: Float64Array } {
  const n = rewards.length;
  const advantages = new Float64Array(n);
  const returns = new Float64Array(n);
  for (let row = 0; row < n / responseLen; row++) {
    let next = 0;
    let nextValue = 0;
    for (let t = responseLen - 1; t >= 0; t--) {
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

/** (x − mean) / (std + eps), with the population std; sums in index order. */
export function whiten(x: ArrayLike<number>, eps = 1e-8): Float64Array {
  const n = x.length;
  let sum = 0;
  for (let i = 0; i < n; i++) sum += x[i]!;
  const mean = sum / n;
  let sq = 0;
  for (let i = 0; i < n; i++) sq += (x[i]! - mean) ** 2;
  const std = Math.sqrt(sq / n);
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) out[i] = (x[i]! - mean) / (std + eps);
  return out;
}

export function mean(x: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < x.length; i++) s += x[i]!;
  return x.length ? s / x.length : 0;
}
