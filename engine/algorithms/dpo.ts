// DPO (Rafailov et al. 2023): offline preference pairs, the policy trained against a frozen
// reference, no generation. Before each update, the pairs of the iteration are scored: the share
// the policy already orders as the labeller did (h(y_w) > h(y_l)) is the iteration's reward.
import { z } from 'zod';
import { defineAlgorithm } from './algorithm.ts';
import type { Graph } from './graph.ts';
import { mean } from './advantages.ts';

/**
 * Per pair (rows: every chosen sequence, then every rejected one), h = Σ_t (log π − log π_ref) of
 * each; the share of pairs with h(y_w) > h(y_l), and the mean implicit reward margin β·(h_w − h_l).
 */
export function preferenceStats(logprobs: ArrayLike<number>, ref: ArrayLike<number>, responseLen: number, beta: number): { accuracy: number; margin: number } {
  const rows = logprobs.length / responseLen;
  const h = new Float64Array(rows);
  for (let b = 0; b < rows; b++) {
    let s = 0;
    for (let t = 0; t < responseLen; t++) s += logprobs[b * responseLen + t]! - ref[b * responseLen + t]!;
    h[b] = s;
  }
  const n = rows / 2;
  let right = 0;
  const margins = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    if (h[i]! > h[n + i]!) right += 1;
    margins[i] = beta * (h[i]! - h[n + i]!);
  }
  return { accuracy: n ? right / n : 0, margin: mean(margins) };
}

export const dpo = defineAlgorithm({
  name: 'dpo',
  summary: 'offline preference pairs, policy against a frozen reference, no generation',
  options: z.strictObject({
    beta: z.number().positive().default(0.1),
    pairs: z
      .string()
      .optional()
      .describe('a JSONL file of pairs, one {"prompt": [ids], "chosen": [ids], "rejected": [ids]} per line (relative to the scenario); default: pairs the task\'s rule labels'),
  }),
  graph: (o, rl): Graph => ({
    source: 'pairs',
    ...(o.pairs === undefined ? {} : { pairsFile: o.pairs }),
    group: 1,
    reward: 'accuracy',
    models: [
      { name: 'actor', head: 'policy', trained: true, lr: rl.lr },
      { name: 'reference', head: 'policy', trained: false, from: 'actor' },
    ],
    calls: [
      { name: 'actor.inference', model: 'actor', fn: 'inference', reads: { tokens: 'pairs' }, writes: { logprobs: 'logprobs' } },
      { name: 'reference.inference', model: 'reference', fn: 'inference', reads: { tokens: 'pairs' }, writes: { logprobs: 'ref_logprobs' } },
      {
        name: 'actor.train',
        model: 'actor',
        fn: 'train',
        loss: { name: 'pair_sigmoid', params: { beta: o.beta } },
        reads: { tokens: 'pairs', ref: 'ref_logprobs' },
        // The accuracy is measured before the update.
        waits: ['logprobs'],
        writes: { loss: 'dpo_loss' },
      },
    ],
    steps: [
      {
        name: 'preferences',
        reads: ['logprobs', 'ref_logprobs'],
        writes: ['accuracy', 'margin'],
        run: (f, ctx) => preferenceStats(f.logprobs as Float32Array, f.ref_logprobs as Float32Array, ctx.responseLen, o.beta),
      },
    ],
  }),
});
