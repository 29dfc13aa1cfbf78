// A user's own algorithm in one file: GRPO's graph with another advantage. Within each prompt's
// group of G samples, a sample's advantage is its rank among the group's rewards, centred and
// scaled to [−1, 1] (ties share their mean rank) — robust to the scale of the reward. Nothing in
// ferry is edited: the scenario names this file, and ferry loads it.
//   npm run scenario -- examples/algorithm/scenario.yaml
import { defineAlgorithm, perToken, rowLengths, sequenceKl, z, type Graph } from '../../engine/api.ts';

/** Ranks within each group, centred and scaled to [−1, 1]; equal rewards share their mean rank. */
export function rankAdvantages(rewards: ArrayLike<number>, group: number): Float64Array {
  const out = new Float64Array(rewards.length);
  for (let g0 = 0; g0 < rewards.length; g0 += group) {
    for (let i = g0; i < g0 + group; i++) {
      let below = 0;
      let equal = 0;
      for (let j = g0; j < g0 + group; j++) {
        if (rewards[j]! < rewards[i]!) below += 1;
        else if (rewards[j]! === rewards[i]!) equal += 1;
      }
      const rank = below + (equal - 1) / 2; // 0 … G − 1
      out[i] = group > 1 ? (2 * rank) / (group - 1) - 1 : 0;
    }
  }
  return out;
}

export default defineAlgorithm({
  name: 'rank_grpo',
  summary: 'GRPO with rank advantages within each group',
  options: z.strictObject({ group: z.number().int().min(2).default(4) }),
  graph: (o, rl): Graph => ({
    source: 'prompts',
    group: o.group,
    reward: 'scores',
    models: [
      { name: 'actor', head: 'policy', trained: true, lr: rl.lr },
      { name: 'reference', head: 'policy', trained: false, from: 'actor' },
      { name: 'reward', head: 'reward', trained: false },
    ],
    calls: [
      { name: 'actor.generate', model: 'actor', fn: 'generate', reads: { prompts: 'prompts' }, writes: { tokens: 'tokens', logprobs: 'logprobs', mask: 'mask' } },
      { name: 'reference.inference', model: 'reference', fn: 'inference', reads: { tokens: 'tokens' }, writes: { logprobs: 'ref_logprobs' } },
      { name: 'reward.inference', model: 'reward', fn: 'inference', reads: { tokens: 'tokens' }, writes: { scores: 'scores' } },
      {
        name: 'actor.train',
        model: 'actor',
        fn: 'train',
        loss: { name: 'clip_policy', params: { clip: rl.clip, kl_coef: rl.kl_coef, kl: 'k3' } },
        reads: { tokens: 'tokens', old: 'logprobs', advantages: 'advantages', ref: 'ref_logprobs' },
        writes: { loss: 'actor_loss' },
      },
    ],
    steps: [
      {
        name: 'advantages',
        reads: ['scores', 'logprobs', 'ref_logprobs', 'mask'],
        writes: ['advantages', 'kl'],
        run: (f, ctx) => {
          // Each response counts up to its own end: its length comes from the mask generation wrote.
          const lengths = rowLengths((f.scores as Float32Array).length, ctx.responseLen, f.mask as Float32Array);
          const kl = sequenceKl(f.logprobs as Float32Array, f.ref_logprobs as Float32Array, ctx.responseLen, 'k1', lengths);
          return { advantages: perToken(rankAdvantages(f.scores as Float32Array, ctx.group), ctx.responseLen, lengths), kl: kl.reduce((a, b) => a + b, 0) / kl.length };
        },
      },
    ],
  }),
});
