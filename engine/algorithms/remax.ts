// ReMax (Li et al. 2023): a second, greedy generation of every prompt; its reward is the sampled
// response's baseline. No critic; the KL is a penalty on the sampled sequence's reward.
import { z } from 'zod';
import { defineAlgorithm } from './algorithm.ts';
import type { Graph } from './graph.ts';
import { estimator } from './advantages.ts';
import { policyLoss, policyLossOption } from './policy-loss.ts';

export const remax = defineAlgorithm({
  name: 'remax',
  summary: 'a greedy generation per prompt; its reward is the baseline; no critic',
  options: z.strictObject({ loss: policyLossOption }),
  graph: (o, rl): Graph => ({
    source: 'prompts',
    group: 1,
    reward: 'scores',
    models: [
      { name: 'actor', head: 'policy', trained: true, lr: rl.lr },
      { name: 'reference', head: 'policy', trained: false, from: 'actor' },
      { name: 'reward', head: 'reward', trained: false },
    ],
    calls: [
      { name: 'actor.generate', model: 'actor', fn: 'generate', reads: { prompts: 'prompts' }, writes: { tokens: 'tokens', logprobs: 'logprobs', mask: 'mask' } },
      { name: 'actor.generate_greedy', model: 'actor', fn: 'generate', greedy: true, reads: { prompts: 'prompts' }, writes: { tokens: 'greedy_tokens' } },
      { name: 'reference.inference', model: 'reference', fn: 'inference', reads: { tokens: 'tokens' }, writes: { logprobs: 'ref_logprobs' } },
      { name: 'reward.inference', model: 'reward', fn: 'inference', reads: { tokens: 'tokens' }, writes: { scores: 'scores' } },
      { name: 'reward.inference_greedy', model: 'reward', fn: 'inference', reads: { tokens: 'greedy_tokens' }, writes: { scores: 'greedy_scores' } },
      {
        name: 'actor.train',
        model: 'actor',
        fn: 'train',
        ...policyLoss(o.loss, { clip: rl.clip }),
      },
    ],
    steps: [
      {
        name: 'advantages',
        reads: ['scores', 'greedy_scores', 'logprobs', 'ref_logprobs', 'mask'],
        writes: ['advantages', 'kl', 'baseline_reward'],
        run: (f, ctx) => {
          const out = estimator('remax')(
            {
              scores: f.scores as Float32Array,
              baseline: f.greedy_scores as Float32Array,
              logprobs: f.logprobs as Float32Array,
              ref: f.ref_logprobs as Float32Array,
              responseLen: ctx.responseLen,
              group: ctx.group,
              mask: f.mask as Float32Array,
            },
            { kl_coef: rl.kl_coef },
          );
          return { advantages: out.advantages, ...out.stats };
        },
      },
    ],
  }),
});
