// PPO (Schulman et al. 2017, as RLHF uses it): actor and critic trained, reference and reward
// frozen. KL-shaped token rewards, GAE over the critic's values, clipped policy and value losses.
import { z } from 'zod';
import { defineAlgorithm } from './algorithm.ts';
import type { Graph } from './graph.ts';
import { estimator } from './advantages.ts';
import { policyLoss, policyLossOption } from './policy-loss.ts';

export const ppo = defineAlgorithm({
  name: 'ppo',
  summary: 'actor and critic; GAE over the critic, KL penalty in the reward, clipped losses',
  options: z.strictObject({
    critic_lr: z.number().positive().default(1e-3),
    value_clip: z.number().positive().default(0.2),
    gamma: z.number().min(0).max(1).default(1),
    lambda: z.number().min(0).max(1).default(0.95),
    loss: policyLossOption,
  }),
  graph: (o, rl): Graph => ({
    source: 'prompts',
    group: 1,
    reward: 'scores',
    models: [
      { name: 'actor', head: 'policy', trained: true, lr: rl.lr },
      { name: 'critic', head: 'value', trained: true, from: 'actor', lr: o.critic_lr },
      { name: 'reference', head: 'policy', trained: false, from: 'actor' },
      { name: 'reward', head: 'reward', trained: false },
    ],
    calls: [
      { name: 'actor.generate', model: 'actor', fn: 'generate', reads: { prompts: 'prompts' }, writes: { tokens: 'tokens', logprobs: 'logprobs', mask: 'mask', step_rewards: 'step_rewards' } },
      { name: 'reference.inference', model: 'reference', fn: 'inference', reads: { tokens: 'tokens' }, writes: { logprobs: 'ref_logprobs' } },
      { name: 'reward.inference', model: 'reward', fn: 'inference', reads: { tokens: 'tokens' }, writes: { scores: 'scores' } },
      { name: 'critic.inference', model: 'critic', fn: 'inference', reads: { tokens: 'tokens' }, writes: { values: 'values' } },
      {
        name: 'actor.train',
        model: 'actor',
        fn: 'train',
        ...policyLoss(o.loss, { clip: rl.clip }),
      },
      {
        name: 'critic.train',
        model: 'critic',
        fn: 'train',
        loss: { name: 'clip_value', params: { clip: o.value_clip } },
        reads: { tokens: 'tokens', old: 'values', returns: 'returns' },
        writes: { loss: 'critic_loss', clipfrac: 'critic_clipfrac' },
      },
    ],
    steps: [
      {
        name: 'advantages',
        reads: ['scores', 'logprobs', 'ref_logprobs', 'values', 'mask', 'step_rewards'],
        writes: ['advantages', 'returns', 'kl'],
        run: (f, ctx) => {
          const out = estimator('gae')(
            {
              scores: f.scores as Float32Array,
              logprobs: f.logprobs as Float32Array,
              ref: f.ref_logprobs as Float32Array,
              values: f.values as Float32Array,
              responseLen: ctx.responseLen,
              group: ctx.group,
              mask: f.mask as Float32Array,
              stepRewards: f.step_rewards as Float32Array,
            },
            { kl_coef: rl.kl_coef, gamma: o.gamma, lambda: o.lambda },
          );
          return { advantages: out.advantages, returns: out.returns!, kl: out.stats.kl! };
        },
      },
    ],
  }),
});
